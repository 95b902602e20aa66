"""Named tensors from a weights file, as numpy arrays, with no code of the file's run.

- `.safetensors`: safetensors' own numpy reader (a JSON header and raw bytes: nothing to execute).
- `.pt` / `.bin` (`torch.save`'s zip): its `data.pkl` read by a pickle machine that knows only what a saved state
  dict is made of - `collections.OrderedDict`, `torch._utils._rebuild_tensor_v2` (and `_rebuild_parameter`) and
  the typed storages, each rebuilt here as numpy from the archive's `data/<key>` bytes. Any other global (a
  function, a class, `os.system`) makes the file refused before anything is called: torch's own
  `torch.load(weights_only=True)` allows the same set, and torch is not a dependency. BAAI ships BGE-M3's heads as
  `.pt` only, so refusing every pickle would refuse the model; safetensors wins where a folder has both.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

# torch's typed storages → numpy dtypes (little-endian, as `byteorder` says every archive since torch 1.10 is)
STORAGES = {"FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "LongStorage": "<i8",
            "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1", "ByteStorage": "u1",
            "BoolStorage": "?"}


class TensorFileError(ValueError):
    """A weights file that cannot be read as named tensors (the message names the file and why)."""


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """The named tensors of `path` (.safetensors, or a torch zip archive), as float32 or their own dtype."""
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            return dict(load_file(str(path)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise TensorFileError(f"{path.name}: not a safetensors file ({exc})") from None
    try:
        with zipfile.ZipFile(path) as archive:
            return _read_archive(archive, path.name)
    except zipfile.BadZipFile:
        raise TensorFileError(f"{path.name}: not a torch zip archive (a legacy pickle file is not read: save it "
                              "again with torch >= 1.6, or as safetensors)") from None
    except OSError as exc:
        raise TensorFileError(f"{path.name}: cannot read it: {exc}") from None


class _Storage:
    """A storage type named by the pickle (the persistent id's second item)."""

    def __init__(self, name: str) -> None:
        self.dtype = np.dtype(STORAGES[name])


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                    *_: Any) -> np.ndarray:
    if not size:
        scalar: np.ndarray = storage[offset:offset + 1].reshape(()).copy()
        return scalar
    end = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1
    if offset < 0 or end > len(storage):
        raise TensorFileError(f"a tensor of size {list(size)} reaches past its storage of {len(storage)}")
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
                                           strides=[s * storage.itemsize for s in stride])
    return np.array(view)


def _rebuild_parameter(data: np.ndarray, *_: Any) -> np.ndarray:
    return data


ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): name for name in STORAGES},
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, where: str) -> None:
        import io

        super().__init__(io.BytesIO(data))
        self.archive, self.prefix, self.where = archive, prefix, where

    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED.get((module, name))
        if found is None:
            raise TensorFileError(f"{self.where}: holds {module}.{name}, not a tensor: refused (only state dicts "
                                  "of tensors are read; no code in a weights file is run)")
        return _Storage(found) if isinstance(found, str) else found

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Storage)):
            raise TensorFileError(f"{self.where}: a persistent reference that is not a storage: refused")
        _, kind, key, _, numel = pid
        try:
            raw = self.archive.read(f"{self.prefix}data/{key}")
        except KeyError:
            raise TensorFileError(f"{self.where}: storage {key!r} is missing from the archive") from None
        values = np.frombuffer(raw, dtype=kind.dtype)
        if len(values) < numel:
            raise TensorFileError(f"{self.where}: storage {key!r} holds {len(values)} values, not {numel}")
        return values


def _read_archive(archive: zipfile.ZipFile, where: str) -> dict[str, np.ndarray]:
    pkl = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
    if pkl is None:
        raise TensorFileError(f"{where}: a zip archive without data.pkl: not a torch.save file")
    prefix = pkl[:-len("data.pkl")]
    byteorder = prefix + "byteorder"
    if byteorder in archive.namelist() and archive.read(byteorder).strip() not in (b"little", b""):
        raise TensorFileError(f"{where}: big-endian tensors are not read")
    try:
        state = _Unpickler(archive.read(pkl), archive, prefix, where).load()
    except TensorFileError:
        raise
    except Exception as exc:   # a malformed pickle: whatever the machine raised, said as the file's fault
        raise TensorFileError(f"{where}: not a readable state dict ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, np.ndarray)
                                              for k, v in state.items()):
        raise TensorFileError(f"{where}: not a state dict of named tensors")
    return dict(state)
