"""services/login.py (a Unix account → the trainyard user, team and role `yard login` gives it) on
real throwaway accounts and groups, and services/login_codes.py (one-time codes) on its own clock."""

from __future__ import annotations

import pwd
from collections.abc import Iterator

import pytest

from tests.accounts import ROOT_ONLY, Accounts, accounts
from tests.plane import TWO_TEAMS
from trainyard.services.auth import Principal
from trainyard.services.errors import Conflict, Forbidden, NotFound, ServiceError
from trainyard.services.login import login_identity
from trainyard.services.login_codes import LoginCodes, TooMany, normalize
from trainyard.spec.models import ConfigSpec, parse_config


@pytest.fixture(scope="module")
def acc() -> Iterator[Accounts]:
    # solo: in vision's group; both: in both teams' groups; none: in neither; mapped: users: maps "mia" to it
    with accounts({"solo": ["vis"], "both": ["vis", "nlp"], "none": [], "mapped": ["nlp"], "away": ["vis"]},
                  ["vis", "nlp"]) as a:
        yield a


def spec_of(acc: Accounts, users: dict[str, str] | None = None) -> ConfigSpec:
    text = TWO_TEAMS.read_text()
    text = text.replace("  - name: vision\n", f"  - name: vision\n    group: {acc.group('vis')}\n")
    text = text.replace("  - name: nlp\n", f"  - name: nlp\n    group: {acc.group('nlp')}\n")
    if users:
        text += "users:\n" + "".join(f"  {u}: {a}\n" for u, a in users.items())
    return parse_config(text)


@ROOT_ONLY
def test_an_account_in_one_teams_group_is_a_member_of_that_team(acc):
    who = login_identity(spec_of(acc), acc.uid("solo"))
    assert (who.user, who.team, who.role, who.account) == (acc.user("solo"), "vision", "member", acc.user("solo"))


@ROOT_ONLY
def test_an_account_in_several_teams_chooses_one_and_only_among_its_own(acc):
    spec = spec_of(acc)
    with pytest.raises(ServiceError) as e:
        login_identity(spec, acc.uid("both"))
    assert e.value.field == "team" and "vision, nlp" in e.value.message and "--team" in e.value.message
    assert login_identity(spec, acc.uid("both"), team="nlp").team == "nlp"
    with pytest.raises(Forbidden, match="not a member of team 'nlp'"):
        login_identity(spec, acc.uid("solo"), team="nlp")


@ROOT_ONLY
def test_an_account_in_no_teams_group_is_refused_naming_the_groups(acc):
    with pytest.raises(Forbidden) as e:
        login_identity(spec_of(acc), acc.uid("none"))
    assert "maps to no team" in e.value.message and acc.group("vis") in e.value.message
    assert f"usermod -aG GROUP {acc.user('none')}" in e.value.message


@ROOT_ONLY
def test_the_users_mapping_is_read_backwards(acc):
    # users: {mia: <mapped>}: the account is mia to trainyard; and a name mapped to another account
    # (users: {<away>: <solo>}) makes the account of that name nobody's
    spec = spec_of(acc, {"mia": acc.user("mapped"), acc.user("away"): acc.user("solo")})
    assert login_identity(spec, acc.uid("mapped")).user == "mia"
    with pytest.raises(Forbidden, match="is nobody's"):
        login_identity(spec, acc.uid("away"))
    two = spec_of(acc, {"mia": acc.user("mapped"), "max": acc.user("mapped")})
    with pytest.raises(Forbidden, match="several users"):
        login_identity(two, acc.uid("mapped"))


@ROOT_ONLY
def test_root_is_refused_without_allow_root_jobs(acc):
    with pytest.raises(Forbidden, match="root"):
        login_identity(spec_of(acc), 0)


def test_a_uid_without_an_account_is_refused():
    free = next(u for u in range(60000, 65000) if not _has_account(u))
    with pytest.raises(Forbidden, match=f"uid {free} has no account"):
        login_identity(parse_config(TWO_TEAMS.read_text()), free)


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


# -- one-time codes ---------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def issuer(made: list[tuple]):  # noqa: ANN201
    def issue(user: str, role: str, team: str | None, how: str) -> str:
        made.append((user, role, team, how))
        return f"tok-{len(made)}"
    return issue


ALICE = Principal("alice", "member", "vision")
BOB = Principal("bob", "member", "nlp")
ADMIN = Principal("admin", "admin")


def test_the_users_own_session_approves_and_the_token_is_collected_once():
    codes, made = LoginCodes(clock=Clock()), []
    opened = codes.new("alice", None)
    assert codes.poll(opened["poll"]) == {"state": "pending", "expires_in": 600}
    out = codes.approve(opened["code"].lower(), ALICE, issuer(made))  # as typed: any case, with the dash
    assert out == {"code": opened["code"], "user": "alice", "role": "member", "team": "vision"}
    assert made == [("alice", "member", "vision", "login:code approved by alice")]
    got = codes.poll(opened["poll"])
    assert got == {"state": "approved", "token": "tok-1", "user": "alice", "role": "member", "team": "vision"}
    with pytest.raises(NotFound):  # single use
        codes.poll(opened["poll"])
    with pytest.raises(NotFound):
        codes.approve(opened["code"], ALICE, issuer(made))
    assert len(made) == 1


def test_another_non_admin_user_cannot_approve_nor_collect_with_the_code():
    codes, made = LoginCodes(clock=Clock()), []
    opened = codes.new("alice", None)
    with pytest.raises(Forbidden) as e:
        codes.approve(opened["code"], BOB, issuer(made))
    assert e.value.status == 403 and "for user 'alice', not you ('bob')" in e.value.message
    with pytest.raises(Forbidden):
        codes.approve(opened["code"], Principal("alice", "job", "vision", job_id=3), issuer(made))
    with pytest.raises(NotFound):  # the code itself does not collect the token: the poll secret does
        codes.poll(opened["code"])
    assert made == [] and codes.poll(opened["poll"])["state"] == "pending"


def test_ones_own_session_hands_on_only_what_it_is():
    codes, made = LoginCodes(clock=Clock()), []
    for role, team, asked in (("admin", None, None), (None, "nlp", None), (None, None, "nlp")):
        opened = codes.new("alice", asked)
        with pytest.raises(Forbidden):
            codes.approve(opened["code"], ALICE, issuer(made), role=role, team=team)
    assert made == []


def test_an_admin_approves_anyones_code_with_the_role_and_team_it_gives():
    codes, made = LoginCodes(clock=Clock()), []
    opened = codes.new("carol", "nlp")
    assert codes.approve(opened["code"], ADMIN, issuer(made))["team"] == "nlp"
    bare = codes.new("dave", None)
    with pytest.raises(ServiceError, match="give one"):
        codes.approve(bare["code"], ADMIN, issuer(made))
    assert codes.approve(bare["code"], ADMIN, issuer(made), role="viewer")["role"] == "viewer"
    with pytest.raises(Conflict):
        codes.approve(bare["code"], ADMIN, issuer(made), role="viewer")
    assert [m[:3] for m in made] == [("carol", "member", "nlp"), ("dave", "viewer", None)]


def test_codes_expire_and_their_number_is_bounded():
    clock = Clock()
    codes = LoginCodes(clock=clock, ttl_s=60, max_pending=2)
    a, _ = codes.new("alice", None), codes.new("bob", None)
    with pytest.raises(TooMany) as e:
        codes.new("carol", None)
    assert e.value.status == 429
    clock.t += 61
    with pytest.raises(NotFound, match="expired"):
        codes.approve(a["code"], ALICE, issuer([]))
    with pytest.raises(NotFound):
        codes.poll(a["poll"])
    codes.new("carol", None)  # the expired ones made room


def test_one_address_cannot_crowd_out_the_others():
    codes = LoginCodes(clock=Clock(), max_pending=100, max_per_source=3)
    for _ in range(3):
        codes.new("mallory", None, source="10.0.0.9")
    with pytest.raises(TooMany, match="10.0.0.9"):
        codes.new("mallory", None, source="10.0.0.9")
    assert codes.new("alice", None, source="10.0.0.7")["user"] == "alice"  # another address still may


def test_codes_are_eight_letters_of_an_unambiguous_alphabet():
    seen = {normalize(LoginCodes().new("x", None)["code"]) for _ in range(50)}
    assert len(seen) == 50 and all(len(c) == 8 and c.isalpha() and not set(c) & set("AEIOU") for c in seen)

