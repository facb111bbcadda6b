"""`images/registry.py` against a real registry: a tag resolves to the digest a pull by digest
fetches; unknown images, a registry that is down and a refused login are told apart."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess

import pytest

from tests import image_builds
from tests.image_registry import push_layout
from tests.images.conftest import ACCESS, ref_at
from trainyard.images import layout, registry
from trainyard.images.types import (
    BAD_IMAGE,
    DISK_FULL,
    NOT_FOUND,
    UNAUTHORIZED,
    UNREACHABLE,
    Credentials,
    ImagePullError,
    RegistryAccess,
)
from trainyard.spec.image_ref import parse_image


def test_a_tag_resolves_to_the_digest_that_a_pull_by_digest_fetches(image_registry, tmp_path):
    tiny = image_builds.tiny()
    tiny.push(image_registry.address, "reg/tiny:v1")
    ref = ref_at(image_registry, "reg/tiny:v1")
    digest = registry.resolve_digest(ref, ACCESS)
    assert digest.startswith("sha256:") and len(digest) == 71
    assert registry.resolve_digest(ref.pinned(digest), ACCESS) == digest
    registry.pull(ref.pinned(digest), ACCESS, tmp_path / "oci", "pinned")
    manifest = layout.manifest_of(tmp_path / "oci", "pinned", "t")
    assert [x["digest"] for x in manifest["layers"]] == tiny.layer_digests()
    index = json.loads((tmp_path / "oci" / "index.json").read_text())
    assert index["manifests"][0]["digest"] == digest  # an OCI image: the registry's digest is the layout's


def test_a_manifest_list_pins_this_machines_entry(image_registry, tmp_path):
    """An OCI index with an arm64 and an amd64 image: the amd64 manifest's digest is what is pinned."""
    tiny = image_builds.tiny()
    work = tmp_path / "multi"
    subprocess.run(["cp", "-a", str(tiny.layout), str(work)], check=True)
    index = json.loads((work / "index.json").read_text())
    desc = dict(index["manifests"][0])
    desc.pop("annotations", None)
    fake_arm = {**desc, "platform": {"os": "linux", "architecture": "arm64"}}
    amd = {**desc, "platform": {"os": "linux", "architecture": "amd64"}}
    list_doc = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": [fake_arm, amd]}).encode()
    hexa = hashlib.sha256(list_doc).hexdigest()
    (work / "blobs" / "sha256" / hexa).write_bytes(list_doc)
    index["manifests"] = [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": f"sha256:{hexa}",
                           "size": len(list_doc), "annotations": {layout.REF_NAME: "multi"}}]
    (work / "index.json").write_text(json.dumps(index))
    push_layout(f"oci:{work}:multi", f"{image_registry.address}/reg/multi:v1")
    ref = ref_at(image_registry, "reg/multi:v1")
    assert registry.resolve_digest(ref, ACCESS) == desc["digest"]


def test_unknown_image_tag_and_digest_are_not_found(image_registry):
    image_builds.tiny().push(image_registry.address, "reg/known:v1")
    for name in ("reg/nothing-here:v1", "reg/known:no-such-tag", "reg/known@sha256:" + "0" * 64):
        with pytest.raises(ImagePullError) as e:
            registry.resolve_digest(ref_at(image_registry, name), ACCESS)
        assert e.value.kind == NOT_FOUND and not e.value.registry_fault, (name, str(e.value))
        assert "\n" not in str(e.value)


def test_a_registry_that_is_down_is_unreachable(image_registry):
    image_builds.tiny().push(image_registry.address, "reg/down:v1")
    ref = ref_at(image_registry, "reg/down:v1")
    image_registry.stop()
    try:
        with pytest.raises(ImagePullError) as e:
            registry.resolve_digest(ref, ACCESS)
    finally:
        image_registry.start()
    assert e.value.kind == UNREACHABLE and e.value.registry_fault
    assert "connection refused" in str(e.value)


def test_tls_is_asked_of_a_registry_not_named_insecure(image_registry):
    """A registry that is not on loopback and not listed insecure is spoken to over HTTPS: a plain
    HTTP one then fails as unreachable (the error says why)."""
    image_builds.tiny().push(image_registry.address, "reg/tls:v1")
    host = socket.gethostname()
    try:
        if socket.gethostbyname(host) != "127.0.0.1" or "." in host:
            raise OSError
    except OSError:
        pytest.skip("this machine's host name does not name 127.0.0.1 in one word")
    address = f"{host}:{image_registry.port}"
    ref = parse_image(f"{address}/reg/tls:v1")
    with pytest.raises(ImagePullError) as e:
        registry.resolve_digest(ref, RegistryAccess())
    assert e.value.kind == UNREACHABLE and "HTTP response to HTTPS client" in str(e.value)
    assert registry.resolve_digest(ref, RegistryAccess(insecure=frozenset({address}))).startswith("sha256:")


def test_a_login_is_needed_and_the_right_one_works(auth_registry):
    creds = (auth_registry.username, auth_registry.password)
    push_layout(image_builds.tiny().ref, f"{auth_registry.address}/reg/private:v1", creds=creds)
    ref = ref_at(auth_registry, "reg/private:v1")
    for access in (RegistryAccess(),
                   RegistryAccess(credentials={auth_registry.address: Credentials("alice", "wrong")})):
        with pytest.raises(ImagePullError) as e:
            registry.resolve_digest(ref, access)
        assert e.value.kind == UNAUTHORIZED and e.value.registry_fault, str(e.value)
    good = RegistryAccess(credentials={auth_registry.address: Credentials(*creds)})
    assert registry.resolve_digest(ref, good).startswith("sha256:")


@pytest.mark.parametrize(("message", "kind"), [
    ("reading manifest v1 in 127.0.0.1:5003/a/b: manifest unknown: manifest unknown", NOT_FOUND),
    ("initializing source docker://h:5000/a:1: reading manifest 1 in h:5000/a: name unknown: repository name not "
     "known to registry", NOT_FOUND),
    ("reading manifest v1 in h/a: unauthorized: authentication required", UNAUTHORIZED),
    ("requested access to the resource is denied", UNAUTHORIZED),
    ("pinging container registry 127.0.0.1:401: Get \"http://127.0.0.1:401/v2/\": dial tcp 127.0.0.1:401: "
     "connect: connection refused", UNREACHABLE),
    ("dial tcp: lookup nowhere.invalid: no such host", UNREACHABLE),
    ("received unexpected HTTP status: 503 Service Unavailable", UNREACHABLE),
    ("reading blob sha256:5000a1401f403: fetching blob: received unexpected HTTP status: 404 Not Found", NOT_FOUND),
    ("writing blob: write /var/cache/oci/blobs/sha256/x: no space left on device", DISK_FULL),
    ("something nobody expected", UNREACHABLE),
    ("reading manifest v1 in h:1/team/tls-timeout: manifest unknown", NOT_FOUND),
])
def test_messages_classify(message, kind):
    assert registry.classify(message) == kind


def test_a_pull_needs_a_digest(tmp_path):
    with pytest.raises(ValueError, match="pinned to a digest"):
        registry.pull(parse_image("localhost:1/a:1"), ACCESS, tmp_path, "x")
    assert BAD_IMAGE  # the kinds are the shared ones
