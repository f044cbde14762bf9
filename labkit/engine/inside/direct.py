"""The engine side of the one-copy sync (transport="direct"): the engine's parameters, shared where they live.

A flattened sync copies every byte twice: the trainer packs it into a bucket, the engine copies it out into its
parameter (labkit.engine.inside.apply). Two copies bound it at half a memcpy, and on the 2-core CPU box the engine's
copy plus one scheduler round trip per bucket was most of a colocated sync (0.13 of 0.19 s on the bench model).
Here the engine moves each parameter's storage into a shared-memory file once, in place (torch's
`_share_filename_cpu_`: the model keeps running on the same storage object, now file-backed), and tells the
trainer file, byte offset, dtype and shape per HF tensor; the trainer maps the files and writes each exported
tensor straight into its slice of the live parameter (labkit.sync.transports.direct). Nothing is applied per
bucket; one call at the end (`DONE_PREFIX`) lets the model re-derive what it computes from its weights at load
(DeepSeek's w_kc/w_vc, `labkit_after_apply`).

Every tensor the model maps to a slice of one parameter (`param_view`: fused q/k/v and gate/up row blocks, an
expert's slice of the fused expert weights, a vocabulary table's true rows, an FFN block a CPU engine padded,
as a strided view whose padding is never written) is shared; the rest (a tied lm_head) goes through SGLang's
`load_weights` as before. CPU engines at TP=1 only: on a GPU the same design is a CUDA-IPC
handle to each parameter (what checkpoint-engine and `update_weights_from_ipc` open on the receiving side),
not built here. The writes land in parameters the engine serves: generation is paused for the sync, and a sync
that fails half way is restored by the atomic guard, as a failed bucket is.

Both calls use the replies SGLang offers a scheduler: `get_weights_by_name(SHARE_PREFIX + request path)` reads
the HF names from that JSON file and writes the answer beside it (`<path>.out`: {"token", "entries"}, each entry
[name, file, storage bytes, byte offset, dtype, shape, strides]); it returns [[entries]]. A later sync asks
`SHARE_PREFIX + AGAIN + token` instead: [[1]] while the answer that token names still holds (every parameter it
names keeps its shared storage), [[0]] otherwise, and the trainer then asks in full. Asking in full every sync
cost 9 ms of a 0.05 s dense `direct` sync and 39 ms for the 4,179-tensor MoE preset (writing and reading the
names and the answer); the short question costs one scheduler round trip (~3 ms).
"""

from __future__ import annotations

import json
import logging
import uuid

from labkit.engine.inside import checkmemo

logger = logging.getLogger(__name__)

SHARE_PREFIX = "labkit.direct/share:"  # get_weights_by_name(SHARE_PREFIX + path of a JSON list of HF names)
AGAIN = "again:"  # SHARE_PREFIX + AGAIN + token: does the answer that token names still hold?
DONE_PREFIX = "labkit-direct/1:"  # update_weights_from_tensor payload name: DONE_PREFIX + JSON list of names written


def share(model, names: list[str], tp_size: int = 1) -> list[list]:
    """[name, shm file, storage bytes, byte offset, dtype, shape, strides] for each of `names` the model holds as
    a slice of a CPU parameter (`param_view`; strided where a CPU engine padded the block); that parameter's
    storage is moved into shared memory (once: a storage already there answers its existing file). The answer
    is kept per request and given again while every parameter it names still has the storage it had (each sync
    asks; resolving 307 names took ~12 ms)."""
    view_of = getattr(model, "param_view", None)
    if view_of is None or tp_size != 1:
        return []
    key = (id(model), tuple(names))
    kept = _answers.get(key)
    if kept is not None and _holds(model, kept):
        return kept[0]
    out, owners = [], {}
    for name in names:
        found = view_of(name)
        if found is None or found[1].device.type != "cpu":
            continue
        view = found[1]
        try:
            _, file, size = view.untyped_storage()._share_filename_cpu_()
        except RuntimeError as e:  # shared another way already (a file descriptor): this one goes through the loader
            logger.warning("labkit direct: %s stays on SGLang's loader: its storage cannot be shared (%s)", name, e)
            continue
        owners[found[0]] = model.get_parameter(found[0]).data_ptr()
        out.append([name, file.decode(), int(size), view.storage_offset() * view.element_size(),
                    str(view.dtype).removeprefix("torch."), list(view.shape), list(view.stride())])
    _answers.clear()  # one model, one plan at a time: keep the latest answer only
    _answers[key] = (out, list(owners.items()), uuid.uuid4().hex)
    return out


_answers: dict[tuple, tuple[list, list, str]] = {}


def token(model, names: list[str]) -> str | None:
    """The token of the kept answer for `names` (what a later sync names to ask whether it still holds)."""
    kept = _answers.get((id(model), tuple(names)))
    return kept[2] if kept is not None else None


def holds(model, tok: str) -> bool:
    """Whether the answer `tok` names is still this model's: the same parameters, each on the shared storage it
    had (a token from another engine process, or an answer dropped for a newer one, holds nothing)."""
    return any(kept[2] == tok and key[0] == id(model) and _holds(model, kept) for key, kept in _answers.items())


def _holds(model, kept) -> bool:
    """Every owning parameter still at its address and still shared: a parameter re-created by a post-load repack
    gets a new, unshared storage (an address alone could be reused by the allocator once the file is unmapped)."""
    for p, ptr in kept[1]:
        param = model.get_parameter(p)
        if param.data_ptr() != ptr or not param.untyped_storage().is_shared():
            return False
    return True


def answer(model, key: str, tp_size: int = 1) -> list[list[int]]:
    """`get_weights_by_name(SHARE_PREFIX + path)`: share what the request file names, write `<path>.out`;
    `SHARE_PREFIX + AGAIN + token`: [[1]] if that answer still holds, else [[0]]."""
    rest = key[len(SHARE_PREFIX):]
    checkmemo.MEMO.hold("transport='direct' shared the parameters: the trainer writes them until it closes the sync")
    if rest.startswith(AGAIN):
        return [[int(holds(model, rest[len(AGAIN):]))]]
    with open(rest) as f:
        names = json.load(f)
    entries = share(model, names, tp_size)
    with open(rest + ".out", "w") as f:
        json.dump({"token": token(model, names) if entries else None, "entries": entries}, f)
    return [[len(entries)]]


def done_key(names: list[str]) -> str:
    return DONE_PREFIX + json.dumps(names, separators=(",", ":"))


def written(key: str) -> list[str]:
    """The names a DONE_PREFIX payload says the trainer wrote."""
    return json.loads(key[len(DONE_PREFIX):])
