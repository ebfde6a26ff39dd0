"""`charlm export --web`: the ONNX export made a static web page that generates text in the browser with
onnxruntime-web (index.html, charlm-page.* and charlm-web.* from charlm/storage/web/), loading the runtime from a pinned
public copy of the npm package, or from a copy bundled beside the page (`--runtime DIR`, for offline hosting)."""

from __future__ import annotations

import shutil
from pathlib import Path

from charlm.errors import UsageError

ORT_WEB_VERSION = "1.30.0"  # the onnxruntime-web release the page is tested with (tests/test_web_export.py)
CDN = f"https://cdn.jsdelivr.net/npm/onnxruntime-web@{ORT_WEB_VERSION}/dist/"
# The WebAssembly build of onnxruntime-web: its script, which sets the global `ort`, and the module and binary it
# loads from the same folder.
RUNTIME_FILES = ("ort.wasm.min.js", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
ASSETS = Path(__file__).parent / "web"
PAGE_FILES = ("index.html", "charlm-page.js", "charlm-page.css", "charlm-web.js", "charlm-web.css")
BUNDLED = "ort/"  # where --runtime's copy goes, relative to index.html

WEB_NOTE = (
    "`index.html`, `charlm-page.*` and `charlm-web.*` make this folder a web page that generates text in the "
    "browser\n(onnxruntime-web): publish the folder on any static host, or try it with "
    "`python -m http.server` in it."
)


def check_runtime(folder: Path) -> Path:
    """A --runtime folder holding onnxruntime-web's WebAssembly build, or one line naming what is missing."""
    if not folder.is_dir():
        raise UsageError(
            f"--runtime {folder} is not a folder: give the dist folder of `npm install onnxruntime-web` "
            "(node_modules/onnxruntime-web/dist)"
        )
    missing = [name for name in RUNTIME_FILES if not (folder / name).is_file()]
    if missing:
        raise UsageError(
            f"--runtime {folder} lacks {', '.join(missing)}: give the dist folder of `npm install "
            f"onnxruntime-web@{ORT_WEB_VERSION}` (node_modules/onnxruntime-web/dist)"
        )
    return folder


def write_page(folder: Path, runtime: Path | None) -> None:
    """The page's files into the export's folder (before it is renamed into place), with the runtime's copy under
    ort/ when `runtime` is given; index.html names where the runtime comes from."""
    base = CDN
    if runtime is not None:
        (folder / BUNDLED).mkdir()
        for name in RUNTIME_FILES:
            shutil.copyfile(runtime / name, folder / BUNDLED / name)
        base = BUNDLED
    for name in PAGE_FILES:
        text = (ASSETS / name).read_text(encoding="utf-8")
        if name == "index.html":
            text = text.replace("{{ORT_BASE}}", base).replace("{{ORT_VERSION}}", ORT_WEB_VERSION)
        (folder / name).write_text(text, encoding="utf-8")
