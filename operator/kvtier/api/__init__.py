"""The kvtier API (group `kvtier.io`, version `v1alpha1`): pydantic models are the source of every CRD."""

from kvtier.api.common import API_VERSION, GROUP, VERSION, Condition, ObjectMeta
from kvtier.api.documents import KINDS
from kvtier.api.errors import FieldProblem, Problem, problems
from kvtier.api.inferencedeployment import InferenceDeployment, InferenceDeploymentSpec, InferenceDeploymentStatus
from kvtier.api.kvpool import KVPool, KVPoolSpec, KVPoolStatus
from kvtier.api.units import format_duration, format_quantity, gib, parse_duration, parse_quantity

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "VERSION",
    "Condition",
    "FieldProblem",
    "InferenceDeployment",
    "InferenceDeploymentSpec",
    "InferenceDeploymentStatus",
    "KVPool",
    "KVPoolSpec",
    "KVPoolStatus",
    "ObjectMeta",
    "Problem",
    "format_duration",
    "format_quantity",
    "gib",
    "parse_duration",
    "parse_quantity",
    "problems",
]
