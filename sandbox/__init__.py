"""The fixed harness: runs one trial on a real vLLM server (python -m sandbox.worker)."""
