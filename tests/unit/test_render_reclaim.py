"""The wipe of a released static volume: a claim that binds exactly that volume, and a Job that wipes all of it."""

import kubernetes_validate
import pytest

from kvtier.api import KVPool
from kvtier.render.reclaim import claim_ref, wipe_claim, wipe_job, wipe_name
from kvtier.storage import HostPathBackend, NVMeoFBackend
from tests.unit.test_render_modes import KUBERNETES_VERSION

UUID = "5b0c8d4e-0f1a-4c2b-9d3e-00000000000a"


def nvmeof_volume():
    pool = KVPool.model_validate(
        {
            "metadata": {"name": "fx100-a"},
            "spec": {
                "capacity": "4Ti",
                "storage": {
                    "nvmeof": {
                        "targets": [{"address": "192.0.2.10"}],
                        "namespaces": [{"nqn": "nqn.2024-06.com.example:kv-0", "uuid": UUID, "size": "4Ti"}],
                    }
                },
            },
        }
    )
    backend = NVMeoFBackend(pool)
    return backend.persistent_volume(backend.spec.namespaces[0], "ml", "kv-store-coder-0")


def hostpath_volume():
    pool = KVPool.model_validate(
        {"metadata": {"name": "dev"}, "spec": {"capacity": "1Ti", "storage": {"hostPath": {"path": "/var/kv"}}}}
    )
    return HostPathBackend(pool).persistent_volume("ml", "kv-store-coder-0", 2**30)


@pytest.mark.parametrize("volume", [nvmeof_volume(), hostpath_volume()], ids=["block", "filesystem"])
def test_the_claim_binds_exactly_the_volume_and_the_job_mounts_it(volume):
    claim, job = wipe_claim(volume, "kvtier-system"), wipe_job(volume, "kvtier-system", "debian:bookworm-slim")
    for obj in (claim, job):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        assert obj["metadata"]["namespace"] == "kvtier-system" and obj["metadata"]["name"] == wipe_name(volume)
        assert obj["metadata"]["annotations"]["kvtier.io/volume"] == volume["metadata"]["name"]
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"] and claim["spec"]["storageClassName"] == ""
    assert claim["spec"]["volumeMode"] == volume["spec"]["volumeMode"]
    assert claim["spec"]["resources"]["requests"]["storage"] == volume["spec"]["capacity"]["storage"]
    ref = claim_ref(volume, "kvtier-system")
    assert (ref["namespace"], ref["name"], ref["uid"]) == ("kvtier-system", claim["metadata"]["name"], None)
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] >= 1
    assert pod["volumes"] == [{"name": "kv-store", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}}]
    assert len(job["metadata"]["name"]) <= 63


def test_a_block_volume_is_discarded_else_zeroed_whole():
    job = wipe_job(nvmeof_volume(), "kvtier-system", "debian:bookworm-slim")
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["volumeDevices"] == [{"name": "kv-store", "devicePath": "/dev/kvtier/kv-store"}]
    assert container["env"] == [{"name": "DEVICE", "value": "/dev/kvtier/kv-store"}]
    assert container["command"][:2] == ["sh", "-ec"]
    discard, zero = container["command"][2].split(" || ")
    assert discard == 'blkdiscard -f "$DEVICE"'
    assert zero.startswith('dd if=/dev/zero of="$DEVICE"') and 'count="$(blockdev --getsize64 "$DEVICE")"' in zero
    assert "iflag=count_bytes" in zero and "conv=fsync" in zero


def test_a_filesystem_volume_loses_every_file():
    job = wipe_job(hostpath_volume(), "kvtier-system", "debian:bookworm-slim")
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["volumeMounts"] == [{"name": "kv-store", "mountPath": "/var/lib/kvtier/kv-store"}]
    assert container["command"][2] == 'find "$DEVICE" -mindepth 1 -delete'
    assert container["env"] == [{"name": "DEVICE", "value": "/var/lib/kvtier/kv-store"}]


def test_names_are_stable_and_distinct():
    assert wipe_name(nvmeof_volume()) == wipe_name(nvmeof_volume()) != wipe_name(hostpath_volume())
