"""What the frameworks' Compression classes share: the engine's spec for a scheme, checked by the engine's own parser
(compression/codec.cc), so a bad ratio is refused here with the engine's message and allowed values."""
from commsched import _C


def topk_spec(ratio):
    """'topk:RATIO' for Compression.topk(ratio); ValueError naming the ratio when it is not in (0, 1]."""
    spec = f"topk:{float(ratio)!r}"
    _C.check_compression(f"Compression.topk({ratio!r}): ratio", spec)
    return spec
