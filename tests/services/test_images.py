"""services/images.py: the registry access a configuration gives (password files read without
following a link, only when no one else may read them), and the refusals at `cluster apply`
time, naming the entry; the team default and the allow-list rules on plain specs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.plane import TWO_TEAMS
from trainyard.services import images
from trainyard.services.errors import Forbidden, ServiceError
from trainyard.spec.container import ContainerOptions
from trainyard.spec.models import parse_config

BASE = TWO_TEAMS.read_text()


def spec_with(images_yaml: str):
    return parse_config(BASE + images_yaml)


def secret(tmp_path: Path, text: str = "s3cret\n", mode: int = 0o600, name: str = "hub.token") -> Path:
    f = tmp_path / name
    f.write_text(text)
    f.chmod(mode)
    return f


def creds(path: Path | str, registry: str = "nvcr.io") -> str:
    return f"images:\n  credentials:\n    - {{registry: {registry}, username: '$oauthtoken', password_file: {path}}}\n" \
           "  insecure_registries: ['registry.lab:5000']\n  pull_timeout_s: 90\n"


def test_registry_access_reads_the_password_and_keeps_it_out_of_repr(tmp_path: Path) -> None:
    access = images.registry_access(spec_with(creds(secret(tmp_path, "s3cret\nignored\n"))))
    assert access.credentials["nvcr.io"].username == "$oauthtoken"
    assert access.credentials["nvcr.io"].password == "s3cret"
    assert "s3cret" not in repr(access)
    assert access.plain_http("registry.lab:5000") and access.plain_http("127.0.0.1:5000")
    assert not access.plain_http("nvcr.io") and access.timeout_s == 90


@pytest.mark.parametrize("make, words", [
    (lambda d: d / "missing", ["no such file"]),
    (lambda d: (os.symlink(secret(d), d / "link"), d / "link")[1], ["is a symbolic link"]),
    (lambda d: (os.mkfifo(d / "fifo"), d / "fifo")[1], ["not a regular file"]),
    (lambda d: secret(d, mode=0o644), ["may be read by others", "mode 0644", "chmod 600"]),
    (lambda d: secret(d, ""), ["is empty"]),
    (lambda d: secret(d, "x" * (65 << 10)), ["over 65536 bytes"]),
    (lambda d: (d / "dir").mkdir() or d / "dir", ["not a regular file"]),
])
def test_an_unusable_password_file_is_an_error_naming_the_entry(tmp_path: Path, make, words) -> None:
    path = make(tmp_path)
    with pytest.raises(ServiceError) as e:
        images.registry_access(spec_with(creds(path)))
    assert e.value.field == "images.credentials.0.password_file", e.value.message
    assert e.value.message.startswith(f"images.credentials.0.password_file: {path}")
    for w in words:
        assert w in e.value.message, e.value.message


def test_cluster_apply_refuses_a_configuration_whose_password_file_cannot_be_read(tmp_path: Path) -> None:
    from tests.plane import Plane, identity_config_text

    p = Plane(tmp_path / "d", start=False)
    try:
        r = p.admin.post("/api/v1/cluster/config", json={"text": identity_config_text() + creds(tmp_path / "nope")})
        assert r.status_code == 400 and r.json()["field"] == "images.credentials.0.password_file", r.text
        ok = p.admin.post("/api/v1/cluster/config", json={"text": identity_config_text() + creds(secret(tmp_path))})
        assert ok.status_code == 200, ok.text
    finally:
        p.stop()


def test_container_for_and_check_allowed() -> None:
    spec = spec_with("images:\n  allowed_registries: [nvcr.io, docker.io]\n  default_image: ubuntu:24.04\n"
                     "  teams: {vision: {allowed_registries: [nvcr.io], default_image: 'nvcr.io#nvidia/pytorch:24.01'}}\n")
    own = ContainerOptions(image="nvcr.io/nvidia/cuda:12")
    assert images.container_for(spec, "vision", own) is own
    assert images.container_for(spec, "vision", None) == ContainerOptions(image="nvcr.io/nvidia/pytorch:24.01")
    assert images.container_for(spec, "nlp", None) == ContainerOptions(image="registry-1.docker.io/library/ubuntu:24.04")
    assert images.container_for(parse_config(BASE), "nlp", None) is None  # no images: a bare job
    images.check_allowed(spec, "nlp", ContainerOptions(image="registry-1.docker.io/library/ubuntu:24.04"))
    images.check_allowed(spec, "vision", ContainerOptions(image="NVCR.io/nvidia/cuda:12"))  # host names know no case
    images.check_allowed(spec, "vision", None)
    with pytest.raises(Forbidden) as e:
        images.check_allowed(spec, "vision", ContainerOptions(image="registry-1.docker.io/library/ubuntu:24.04"))
    assert e.value.message == ("registry 'registry-1.docker.io' is not allowed for team 'vision' "
                               "(images.teams.vision.allowed_registries: nvcr.io)") and e.value.field == "container.image"


def test_options_without_an_image_need_a_team_default() -> None:
    sub = images.ContainerSubmit(mounts="/data")
    with pytest.raises(ServiceError) as e:
        images.requested(parse_config(BASE), "nlp", sub)
    assert e.value.field == "container.image" and "team 'nlp' has no default image" in e.value.message
    spec = spec_with("images: {default_image: 'ubuntu:24.04'}\n")
    got = images.requested(spec, "nlp", sub)
    assert got is not None and got.image.endswith("ubuntu:24.04") and got.mounts[0].src == "/data"


def test_a_recipe_command_runs_the_images_python():
    from trainyard.services.images import recipe_in_image

    assert recipe_in_image(["/root/.venv/bin/python", "-m", "trainyard.recipes", "llama-pretrain"]) == \
        ["python3", "-m", "trainyard.recipes", "llama-pretrain"]
    assert recipe_in_image(["python3", "-m", "trainyard.recipes", "x"]) == ["python3", "-m", "trainyard.recipes", "x"]
    assert recipe_in_image(["/usr/bin/python3", "train.py"]) == ["/usr/bin/python3", "train.py"]  # the user's own
    assert recipe_in_image(["/opt/bin/runner", "-m", "trainyard.recipes"]) == ["/opt/bin/runner", "-m", "trainyard.recipes"]
