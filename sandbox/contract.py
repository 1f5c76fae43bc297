"""Every name agent/ may import from the harness, and nothing else (tests/test_contract.py fails on
any other import of sandbox from agent/, inside a function or through importlib too).

The trial itself crosses as two files: the spec the agent writes (sandbox.spec) and the result the
worker writes (sandbox.result), run by `python -m sandbox.worker` in a process of its own. What the
agent needs beyond them is here: reading those files, checking flags before they reach a spec, the
user's traffic and meters, the host's facts, and the embedded model.
"""

from sandbox.allowed import check as check_allowed
from sandbox.allowed import digest as allowed_digest
from sandbox.arrivals import unit_times
from sandbox.failures import FailureClass
from sandbox.goodput import lower_bound as goodput_lower_bound
from sandbox.host import engine as engine_info
from sandbox.host import gpu_memory_used_mib, gpus, hardware, visible_ids
from sandbox.ladders import SLO_FIELDS, Ladder
from sandbox.metrics import share_above
from sandbox.model import MIN_TRANSFORMERS, ModelError, check_transformers
from sandbox.model import default_dir as default_model_dir
from sandbox.model import is_ready as model_is_ready
from sandbox.model import prepare as prepare_model
from sandbox.result import Figures, Quality, ResultError, TrialResult
from sandbox.result import failed as failed_result
from sandbox.result import read as read_result
from sandbox.server import session_members
from sandbox.spec import ENV_ALLOWLIST, FLAG_NAME, SpecError, SpecFile, StopRules, check_env, check_flags
from sandbox.traffic import Request, Traffic, TrafficError
from sandbox.traffic import load as load_traffic
from sandbox.workload import Quality as QualitySet
from sandbox.workload import Workload, check_objective, file_digest, latency_of, load_quality, load_workload

__all__ = [
    # the trial's two files
    "SpecFile", "StopRules", "TrialResult", "Figures", "Quality", "ResultError", "read_result", "failed_result",
    "SpecError", "FailureClass",
    # flags and variables checked before they reach a spec
    "FLAG_NAME", "ENV_ALLOWLIST", "check_flags", "check_env", "check_allowed", "allowed_digest",
    # the user's traffic and the meters
    "Request", "Traffic", "TrafficError", "load_traffic", "Workload", "QualitySet", "load_workload", "load_quality",
    "check_objective", "file_digest", "latency_of", "unit_times", "goodput_lower_bound", "share_above", "Ladder",
    "SLO_FIELDS",
    # the host, the engine and a trial's processes
    "engine_info", "hardware", "gpus", "visible_ids", "gpu_memory_used_mib", "session_members",
    # the embedded model
    "MIN_TRANSFORMERS", "ModelError", "check_transformers", "default_model_dir", "model_is_ready", "prepare_model",
]
