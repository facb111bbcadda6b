"""contain.oci_spec: the config.json of one rank's container, from facts alone (pure)."""

from __future__ import annotations

from dataclasses import replace

from trainyard.backends.contain import oci_spec
from trainyard.backends.contain.oci_spec import Bind, GpuDevice, Identity, RankContainer
from trainyard.images.types import ImageConfig
from trainyard.spec.container import ContainerOptions

IMAGE = ImageConfig(env=("PATH=/opt/venv/bin:/usr/bin", "LD_LIBRARY_PATH=/opt/lib", "RANK=99", "LANG=C"),
                    entrypoint=("/entry.sh",))
BASE = RankContainer(command=["python", "train.py"], env={"PATH": "/host/bin", "LD_LIBRARY_PATH": "/host/lib",
                                                        "RANK": "3", "TRAINYARD_JOB_ID": "7", "MINE": "x",
                                                        "SLURM_PROCID": "3", "LANG": "en_US.UTF-8"},
                     image=IMAGE, options=ContainerOptions(image="r/i"), identity=Identity(1005, 1005, (1005, 2000)),
                     workdir="/work/me", rootfs="/b/rootfs", cgroups_path="trainyard-x-j7.a1-r3", tmp="/t/tmp",
                     shm="/t/shm", binds=(Bind("/b/mnt/1", "/work/me/data", read_only=True), Bind("/b/mnt/0", "/work/me")),
                     devices=(GpuDevice("/d/nvidia2", "/dev/nvidia2", 195, 2),), passwd="/b/passwd", group="/b/group")


def env_of(cfg: dict) -> dict[str, str]:
    return dict(item.split("=", 1) for item in cfg["process"]["env"])


def test_the_image_wins_for_its_own_names_the_host_for_the_contract_and_for_names_asked():
    env = env_of(oci_spec.config(BASE))
    assert env["PATH"] == "/opt/venv/bin:/usr/bin" and env["LD_LIBRARY_PATH"] == "/opt/lib" and env["LANG"] == "C"
    assert env["RANK"] == "3" and env["TRAINYARD_JOB_ID"] == "7" and env["SLURM_PROCID"] == "3"
    assert env["MINE"] == "x" and env["TMPDIR"] == "/tmp"
    asked = env_of(oci_spec.config(replace(BASE, options=ContainerOptions(image="r/i", env=("LANG",)))))
    assert asked["LANG"] == "en_US.UTF-8" and asked["PATH"] == "/opt/venv/bin:/usr/bin"
    batch = env_of(oci_spec.config(replace(BASE, path_prefix="/run/bin")))
    assert batch["PATH"] == "/run/bin:/opt/venv/bin:/usr/bin"


def test_the_owner_without_capabilities_or_root_only_when_remapped():
    cfg = oci_spec.config(BASE)
    proc = cfg["process"]
    assert proc["user"] == {"uid": 1005, "gid": 1005, "additionalGids": [2000]}
    assert proc["noNewPrivileges"] and proc["capabilities"]["effective"] == [] and not proc["terminal"]
    assert proc["args"] == ["python", "train.py"] and proc["cwd"] == "/work/me"
    assert [n["type"] for n in cfg["linux"]["namespaces"]] == ["mount"]  # no pid, no network namespace
    remap = oci_spec.config(replace(BASE, options=ContainerOptions(image="r/i", remap_root=True, workdir="/w",
                                                                    entrypoint=True)))
    assert remap["process"]["user"] == {"uid": 0, "gid": 0}
    assert remap["linux"]["uidMappings"] == [{"containerID": 0, "hostID": 1005, "size": 1}]
    assert [n["type"] for n in remap["linux"]["namespaces"]] == ["mount", "user"]
    assert remap["process"]["args"] == ["/entry.sh", "python", "train.py"] and remap["process"]["cwd"] == "/w"
    mounts = {m["destination"]: m for m in remap["mounts"]}
    assert "gid=5" not in mounts["/dev/pts"]["options"] and mounts["/sys"]["type"] == "bind"
    assert mounts["/proc"]["source"] == "/proc" and "devices" not in remap["linux"]  # bound, not made


def test_mounts_parents_first_ro_honoured_and_only_the_ranks_devices():
    cfg = oci_spec.config(BASE)
    dests = [m["destination"] for m in cfg["mounts"]]
    assert dests.index("/work/me") < dests.index("/work/me/data")
    by = {m["destination"]: m for m in cfg["mounts"]}
    assert "ro" in by["/work/me/data"]["options"] and "rw" in by["/work/me"]["options"]
    assert {"nosuid", "nodev"} <= set(by["/work/me"]["options"])
    assert by["/dev/shm"]["source"] == "/t/shm" and by["/tmp"]["source"] == "/t/tmp"
    assert by["/etc/passwd"]["source"] == "/b/passwd" and "ro" in by["/etc/passwd"]["options"]
    assert cfg["root"] == {"path": "/b/rootfs", "readonly": False}
    assert cfg["linux"]["cgroupsPath"] == "trainyard-x-j7.a1-r3"  # relative: below the rank's cgroups
    assert cfg["linux"]["devices"] == [{"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2,
                                        "fileMode": 0o666, "uid": 0, "gid": 0}]
    assert cfg["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"},
                                                    {"allow": True, "type": "c", "major": 195, "minor": 2, "access": "rwm"}]
    ro = oci_spec.config(replace(BASE, options=ContainerOptions(image="r/i", writable=False)))
    assert ro["root"]["readonly"] is True


def test_passwd_and_group_hold_the_owner_once():
    image = "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nold:x:1005:1:::\n"
    text = oci_spec.passwd_with(image, "alice", 1005, 1005, "/home/alice")
    assert text.splitlines() == ["root:x:0:0:root:/root:/bin/sh", "alice:x:1005:1005::/home/alice:/bin/sh"]
    group = oci_spec.group_with("root:x:0:\nteam:x:7:\nusers:x:2000:\n", "alice", [("alice", 1005), ("team", 2000)])
    assert group.splitlines() == ["root:x:0:", "alice:x:1005:alice", "team:x:2000:alice"]
    assert oci_spec.passwd_with(None, "a", 1, 1, "/") == "a:x:1:1::/:/bin/sh\n"


def test_the_gpu_drivers_library_dir_goes_last_on_ld_library_path():
    from trainyard.backends.contain.oci_spec import DRIVER_LIB_DIR, process_env

    env = dict(e.split("=", 1) for e in process_env(["LD_LIBRARY_PATH=/opt/cuda/lib64"], {}, library_dir=DRIVER_LIB_DIR))
    assert env["LD_LIBRARY_PATH"] == f"/opt/cuda/lib64:{DRIVER_LIB_DIR}"
    env = dict(e.split("=", 1) for e in process_env([f"LD_LIBRARY_PATH={DRIVER_LIB_DIR}"], {}, library_dir=DRIVER_LIB_DIR))
    assert env["LD_LIBRARY_PATH"] == DRIVER_LIB_DIR  # NVIDIA's images name it already
    assert "LD_LIBRARY_PATH" not in dict(e.split("=", 1) for e in process_env([], {}))
