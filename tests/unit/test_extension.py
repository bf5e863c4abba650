"""The extension loader: a load failure says what the dynamic loader said, and what to do."""

from __future__ import annotations

from polykernels._extension import describe_load_failure


def test_a_load_failure_reports_the_loaders_message_and_what_to_do() -> None:
    try:
        try:
            raise OSError("libcudart.so.13: cannot open shared object file: No such file or directory")
        except OSError as inner:
            raise OSError("Could not load this library: /x/_C.abi3.so") from inner
    except OSError as exc:
        message = describe_load_failure("_C.abi3.so", exc)
    assert "libcudart.so.13: cannot open shared object file" in message
    assert "POLYKERNELS_BACKEND=cpu" in message
    undefined = describe_load_failure("_C.abi3.so", OSError("_C.abi3.so: undefined symbol: aoti_torch_foo"))
    assert "undefined symbol: aoti_torch_foo" in undefined and "upgrade torch" in undefined
