"""result.json: one per run, written by rank 0, shaped by trainer/result_schema.json."""

from __future__ import annotations

import functools
import json
import os
import platform
import tempfile
from pathlib import Path

SCHEMA_PATH = Path(__file__).with_name("result_schema.json")
RESULT_FILE_NAME = "result.json"


@functools.cache
def load_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def validate_result(result: dict) -> None:
    """Raise jsonschema.ValidationError if `result` does not follow the schema."""
    import jsonschema

    jsonschema.validate(result, load_schema(), cls=jsonschema.Draft202012Validator)


def write_result(result: dict, output_dir: str | Path) -> Path:
    """Validate, then write atomically, so a reader never sees half a result."""
    validate_result(result)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".result-", suffix=".json", dir=output_dir)
    with os.fdopen(handle, "w") as stream:
        json.dump(result, stream, indent=2)
        stream.write("\n")
    final = output_dir / RESULT_FILE_NAME
    os.replace(temporary, final)
    return final


def versions() -> dict:
    import torch
    import transformers

    cuda = torch.version.cuda if torch.cuda.is_available() else None
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):  # CUDA-only: the NCCL build version
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "cuda": cuda, "nccl": nccl, **gpu_description()}


def gpu_description() -> dict:
    """CUDA-only: {"gpu": "NVIDIA H100 80GB HBM3 (sm 9.0)", "driver": "580.159.04"}; None values on CPU."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": None, "driver": None}
    major, minor = torch.cuda.get_device_capability()
    driver = None
    try:  # NVML comes with the driver; pynvml (nvidia-ml-py) is its Python binding
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    except Exception:  # no binding or no NVML: the driver stays unknown  # noqa: BLE001
        driver = None
    return {"gpu": f"{torch.cuda.get_device_name()} (sm {major}.{minor})", "driver": driver}
