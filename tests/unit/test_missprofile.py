"""loadtest/missprofile.py counts as docs/architecture.md says ("Counting the miss path"): a
new frame of a gateway function is a call, a coroutine resumed is not; a call from another
part is a crossing, one from outside the gateway an entry; idle work is taken off."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import textwrap
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from loadtest import missprofile


def _module(root: Path, rel: str, source: str) -> ModuleType:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    name = "mp_" + rel.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_calls_crossings_and_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "gateway"
    monkeypatch.setattr(missprofile, "_GATEWAY", str(root) + os.sep)
    store = _module(
        root,
        "stores/s3/get.py",
        """
        import asyncio

        async def fetch():
            for _ in range(3):
                await asyncio.sleep(0)  # resumed three times: still one call
            return helper()

        def helper():
            return 1
        """,
    )
    _module(
        root,
        "service/reads.py",
        """
        from mp_stores_s3_get import fetch

        async def get():
            return await fetch() + await fetch()
        """,
    )
    import mp_service_reads  # type: ignore[import-not-found]

    tracer = missprofile._Tracer()
    tracer.on = True
    sys.setprofile(tracer.hook)
    try:
        assert asyncio.run(mp_service_reads.get()) == 2
    finally:
        sys.setprofile(None)
    calls = {name.split("(")[1].rstrip(")"): n for name, n in tracer.calls.items()}
    assert calls == {"get": 1, "fetch": 2, "helper": 2}
    assert tracer.crossings == Counter({"service->stores": 2})
    assert tracer.entries == Counter({"service": 1})  # asyncio.run started it
    assert store.helper() == 1


def test_idle_work_is_taken_off_per_function() -> None:
    idle = {
        "seconds": 8.0,
        "calls": Counter({"cache:janitor": 8}),
        "crossings": Counter(),
        "entries": Counter({"cache": 8}),
    }
    window = {
        "seconds": 0.5,
        "calls": Counter({"cache:janitor": 1, "service:get": 1, "stores:open": 1}),
        "crossings": Counter({"service->stores": 1}),
        "entries": Counter({"cache": 1, "s3": 1}),
    }
    got = missprofile._per_get(window, idle, 1)
    assert got["calls"] == 2.5  # the janitor's 0.5 expected in 0.5 s taken off
    assert got["crossings"] == 1 and got["entries"] == 1.5
    assert got["calls_by_part"] == {"service": 1, "stores": 1, "cache": 0.5}
