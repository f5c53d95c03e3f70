"""Update rules of built-in kinds beyond their schema: immutable parts of a spec, and the PVC resize admission.

They run on every write that changes an existing object's spec — update, every patch type and
server-side apply alike — after defaulting and schema validation, as the real server's
`ValidateUpdate` (422 Invalid) and then its validating admission plugins (403 Forbidden) do.
Messages are the real ones, from kubernetes/kubernetes:

* StatefulSet: `pkg/apis/apps/validation/validation.go`, `ValidateStatefulSetUpdate`: everything but
  `replicas`, `ordinals`, `template`, `updateStrategy`, `persistentVolumeClaimRetentionPolicy` and
  `minReadySeconds` is fixed at creation (so are `volumeClaimTemplates`: raising a claim's size there
  fails forever; existing claims are expanded one by one instead).
* PersistentVolumeClaim: `pkg/apis/core/validation/validation.go`, `ValidatePersistentVolumeClaimUpdate`:
  only `resources.requests` (of a Bound claim), `volumeAttributesClassName` and a first `volumeName`
  may change, and the storage request may not decrease. Simplifications: the spec diff the real
  message appends is a short field list here, and the `RecoverVolumeExpansionFailure` feature gate
  (which lets a failed expansion be walked back down to `status.capacity`) is modelled off.
* PVC resize admission: `plugin/pkg/admission/storage/persistentvolume/resize/admission.go`: growing
  a claim needs it Bound and its StorageClass (the same, non-empty name before and after) to have
  `allowVolumeExpansion: true`; statically provisioned claims (class `""`) can never grow.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from kvtier.api.units import quantity_value

from . import errors
from .errors import FieldError

STATEFULSETS = ("apps", "statefulsets")
CLAIMS = ("", "persistentvolumeclaims")
#: `ValidateStatefulSetUpdate` copies these from the old object before comparing the rest.
STATEFULSET_MUTABLE = (
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
)
STATEFULSET_FORBIDDEN = (
    "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', "
    "'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
)
CLAIM_SPEC_FORBIDDEN = (
    "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
)
CLAIM_SHRINK_FORBIDDEN = "field can not be less than previous value"
RESIZE_NOT_BOUND = "Only bound persistent volume claims can be expanded"
RESIZE_NOT_ALLOWED = (
    "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"
)
#: The beta annotation `GetPersistentVolumeClaimClass` still reads before `spec.storageClassName`.
BETA_CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"


def update_errors(storage_key: tuple[str, str], new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    """What `ValidateUpdate` of the kind rejects in the change from `old` to `new` (both defaulted)."""
    if storage_key == STATEFULSETS:
        return _statefulset_errors(new.get("spec") or {}, old.get("spec") or {})
    if storage_key == CLAIMS:
        return _claim_errors(new, old)
    return []


def admit_update(
    storage_key: tuple[str, str],
    new: dict[str, Any],
    old: dict[str, Any],
    storage_class: Callable[[str], dict[str, Any] | None],
) -> None:
    """The PersistentVolumeClaimResize admission plugin: raises 403 for a growth it does not allow."""
    if storage_key != CLAIMS or _storage(new) <= _storage(old):
        return
    name = new["metadata"]["name"]
    if (old.get("status") or {}).get("phase") != "Bound":
        raise _forbidden(name, RESIZE_NOT_BOUND)
    wanted, before = _claim_class(new), _claim_class(old)
    found = storage_class(wanted) if wanted and wanted == before else None
    if found is None or found.get("allowVolumeExpansion") is not True:
        raise _forbidden(name, RESIZE_NOT_ALLOWED)


def _forbidden(name: str, why: str) -> errors.StatusError:
    return errors.forbidden("", "persistentvolumeclaims", name, f'persistentvolumeclaims "{name}" is forbidden: {why}')


def _statefulset_errors(new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    def fixed(spec: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in spec.items() if key not in STATEFULSET_MUTABLE}

    if fixed(new) != fixed(old):
        return [FieldError("spec", "Forbidden", STATEFULSET_FORBIDDEN)]
    return []


def _storage(claim: dict[str, Any]) -> Decimal:
    requests = ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}
    return quantity_value(str(requests.get("storage", "0")))


def _claim_class(claim: dict[str, Any]) -> str:
    annotations = claim["metadata"].get("annotations") or {}
    if BETA_CLASS_ANNOTATION in annotations:
        return annotations[BETA_CLASS_ANNOTATION]
    return (claim.get("spec") or {}).get("storageClassName") or ""


def _claim_errors(new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    compared_new, compared_old = copy.deepcopy(new_spec), copy.deepcopy(old_spec)
    if not old_spec.get("volumeName"):  # the binder sets volumeName once
        compared_old["volumeName"] = compared_new.get("volumeName")
    if (new.get("status") or {}).get("phase") == "Bound":
        requests = compared_new.setdefault("resources", {}).setdefault("requests", {})
        requests.pop("storage", None)
        old_storage = ((old_spec.get("resources") or {}).get("requests") or {}).get("storage")
        if old_storage is not None:
            requests["storage"] = old_storage
    compared_new["volumeAttributesClassName"] = compared_old.get("volumeAttributesClassName")
    problems = []
    changed = sorted(
        key
        for key in set(compared_new) | set(compared_old)
        if _present(compared_new.get(key)) != _present(compared_old.get(key))
    )
    if changed:
        diff = "".join(f"\n  {key}: {compared_old.get(key)!r} -> {compared_new.get(key)!r}" for key in changed)
        problems.append(FieldError("spec", "Forbidden", CLAIM_SPEC_FORBIDDEN + diff))
    if _storage(new) < _storage(old):
        problems.append(FieldError("spec.resources.requests.storage", "Forbidden", CLAIM_SHRINK_FORBIDDEN))
    if new_spec.get("volumeMode") != old_spec.get("volumeMode"):
        # The real validator reports this at the path "volumeMode" (sic), beside the spec error above.
        problems.append(FieldError("volumeMode", "Invalid value", "field is immutable", new_spec.get("volumeMode")))
    return problems


def _present(value: Any) -> Any:
    """The value without empty members: an absent field, null and {} compare equal, as Go's zero values do."""
    if isinstance(value, dict):
        kept = {key: _present(item) for key, item in value.items()}
        return {key: item for key, item in kept.items() if item not in (None, {})} or None
    if isinstance(value, list):
        return [_present(item) for item in value]
    return value
