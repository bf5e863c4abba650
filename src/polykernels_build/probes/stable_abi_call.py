"""Load a built extension with no Python torch at all, and call its CPU kernel through the stable C ABI.

Runs inside a builder image (any Python, e.g. Debian sid's for the ROCm build) with the torch SDK's
libraries on LD_LIBRARY_PATH: dlopen(RTLD_NOW) proves every symbol resolves; the op registered by the
library's static initializer is then called through `torch_call_dispatcher` on a CPU tensor and its
result checked against the INT4 rule, and called once more with a group size it refuses: the check's C++
exception must come back through torch as an error code. Built with a C++ toolchain whose exceptions
cannot reach torch's, the library kills the process there instead, on every bad input a user passes (an
in-place build on a GPU host did: BENCHMARKS.md, 2026-12-05); the call runs in a process of its own, so
the probe says so. Then the same library is imported as the Python module it also is (its direct launch,
Python's limited API: this interpreter may be any Python from 3.10 on), and
says whether it can launch GPU kernels. Prints one JSON line, which `checks.check_loads` judges.

    python stable_abi_call.py path/to/_C.abi3.so [now|lazy]

`lazy` (CUDA builds): bind functions on first call. The CUDA build references one GPU-only stable
shim (the current-stream accessor) that lives in libtorch_cuda, absent from a CPU torch SDK; the
CPU kernel never calls it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import subprocess
import sys

GROUP = 32
TORCH_2_13 = 0x020D000000000000


def gpu_runtimes() -> list[str]:
    """The GPU runtime libraries mapped into this process (the loader's choice, not a guess)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libamdhip64.so" in line or "/libcudart.so" in line}
    return sorted(paths)


def main(so_path: str, binding: str = "now", step: str = "all") -> int:
    torch_cpu = ctypes.CDLL("libtorch_cpu.so", mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    mode = (os.RTLD_LAZY if binding == "lazy" else os.RTLD_NOW) | os.RTLD_GLOBAL
    ctypes.CDLL(so_path, mode=mode)  # its static initializer registers polykernels::* ops

    def call(name: str, *args: object, restype: object = ctypes.c_int32) -> object:
        fn = getattr(torch_cpu, name)
        fn.restype = restype
        return fn(*args)

    values = [float(i - 15) / 4.0 for i in range(GROUP)]  # -3.75 .. 4.0
    sizes, strides = (ctypes.c_int64 * 2)(1, GROUP), (ctypes.c_int64 * 2)(GROUP, 1)
    handle = ctypes.c_void_p()
    error = call("aoti_torch_empty_strided", ctypes.c_int64(2), sizes, strides, call("aoti_torch_dtype_float32"),
                 call("aoti_torch_device_type_cpu"), ctypes.c_int32(0), ctypes.byref(handle))
    if error:
        raise SystemExit("aoti_torch_empty_strided failed")
    if step == "refuse":  # refuses_bad_group_size's process: 0 when the dispatcher returns an error code
        stack = (ctypes.c_uint64 * 3)(handle.value, GROUP + 1, 1)
        error = call("torch_call_dispatcher", b"polykernels::fake_int4_quant", b"", stack, ctypes.c_uint64(TORCH_2_13))
        return 0 if error else 3
    data = ctypes.c_void_p()
    call("aoti_torch_get_data_ptr", handle, ctypes.byref(data))
    ctypes.memmove(data, (ctypes.c_float * GROUP)(*values), 4 * GROUP)

    stack = (ctypes.c_uint64 * 3)(handle.value, GROUP, 1)  # (x, group_size, symmetric=True)
    error = call("torch_call_dispatcher", b"polykernels::fake_int4_quant", b"", stack, ctypes.c_uint64(TORCH_2_13))
    if error:
        print(json.dumps({"loaded": True, "called": False, "gpu_runtimes": gpu_runtimes()}))
        return 1
    out_data, scale_data = ctypes.c_void_p(), ctypes.c_void_p()
    call("aoti_torch_get_data_ptr", ctypes.c_void_p(stack[0]), ctypes.byref(out_data))
    call("aoti_torch_get_data_ptr", ctypes.c_void_p(stack[1]), ctypes.byref(scale_data))
    out = list((ctypes.c_float * GROUP).from_address(out_data.value))
    scale = ctypes.c_float.from_address(scale_data.value).value
    inv7 = ctypes.c_float(1 / 7).value
    want_scale = ctypes.c_float(ctypes.c_float(4.0).value * inv7).value
    want = [max(-7.0, min(7.0, round(ctypes.c_float(v / want_scale).value))) * want_scale for v in values]
    ok = scale == want_scale and all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(out, want, strict=True))
    refused = refuses_bad_group_size(so_path, binding)
    print(json.dumps({"loaded": True, "called": True, "scale": scale, "matches_rule": ok,
                      "refuses_bad_input": refused, "gpu_launch": module_gpu_launch(so_path, mode),
                      "gpu_runtimes": gpu_runtimes()}))
    return 0  # the report is the verdict's input: checks.check_loads judges it and names what failed


def refuses_bad_group_size(so_path: str, binding: str) -> bool | str:
    """fake_int4_quant with group size GROUP + 1, in a process of its own (this probe, `refuse`): True
    when torch hands back an error code, else what happened (the call went through, or the process died)."""
    code = subprocess.run([sys.executable, __file__, so_path, binding, "refuse"], check=False).returncode
    if code == 0:
        return True
    if code < 0:
        return f"the process died of signal {-code} (the check's exception did not reach torch)"
    return f"accepted a group size of {GROUP + 1}" if code == 3 else f"exited with {code}"


def module_gpu_launch(so_path: str, mode: int) -> bool | str:
    """The library imported as polykernels._C: whether it launches GPU kernels, or why it did not import."""
    sys.setdlopenflags(mode)  # the library is loaded already: the import must not bind it more eagerly
    spec = importlib.util.spec_from_file_location("polykernels._C", so_path)
    try:
        module = importlib.util.module_from_spec(spec)
    except ImportError as error:
        return f"not importable: {error}"
    return bool(module.has_gpu_launch())


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
