"""Snapshot codecs: how a rank block is turned into stored bytes and back.

Three kinds, named by a spec string (``--compress``):

- ``none``: the block's C-order bytes as they are.
- ``lossless[:CNAME]``: Blosc byte-shuffle (the bytes of each float regrouped by significance, so
  the slowly varying exponent bytes sit together) followed by a fast codec: ``lz4`` at Blosc level 9
  by default (fastest; experiments/compression measured the choices), ``zstd`` (level 1, 1 MiB
  blocks), ``lz4hc``, ``zlib`` and ``blosclz`` on request; or ``lossless:zfp``, zfp's
  reversible mode (a decorrelating transform of 4^d blocks: better on smooth fields, slower).
  Decoding is **bitwise**; a zfp-reversible block is decoded once on encode and stored with Blosc if
  it does not come back bit for bit. Blosc comes from numcodecs (Debian's python3-numcodecs).
- ``lossy:TOL``: zfp in fixed-accuracy mode (Debian's python3-zfpy). TOL is an **absolute**,
  pointwise bound: every decoded value differs from the stored one by at most TOL, in the field's
  own units. zfp's accuracy mode aims at that bound; the codec does not trust it: it decodes every
  block it encodes and checks ``max |decoded - original| <= TOL``, and stores a block whose check
  fails (or that holds NaN/inf, is not float32/float64, or is too small to gain) losslessly instead.
  The check doubles as the decoded checksum's source, so it costs one zfp decode per write.

Every encoded block carries two CRC-32 checksums: one of the stored (encoded) payload, checked
before decoding, and one of the decoded block's bytes, checked after; a mismatch raises
:class:`CodecError`. :meth:`EncodedBlock.to_bytes` gives a self-describing container (magic, a
header with its own CRC, the payload) for file-backed levels.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from ...snapshot import Snapshot

#: Blosc1 refuses buffers of 2 GiB or more: larger blocks are compressed in chunks of this many bytes
CHUNK_BYTES = 256 * 1024 * 1024
#: Blosc (clevel, blocksize) per codec name: lz4's level mostly sets Blosc's block size; zstd at
#: level 1 with Blosc's automatic (small) blocks compressed wave 128^3 states 1.11x, with 1 MiB 1.46x
BLOSC_SETTINGS = {"lz4": (9, 0), "zstd": (1, 1 << 20), "lz4hc": (5, 0), "zlib": (5, 0),
                  "blosclz": (5, 0)}
#: blocks smaller than this are stored raw by the compressing codecs (headers would eat the gain)
MIN_COMPRESS_BYTES = 256
#: Blosc's bytes beyond the input in a compressed buffer (BLOSC_MAX_OVERHEAD)
BLOSC_OVERHEAD = 16
#: bytes of a field's headers in a stored frame (container prefix, JSON header, field name)
FRAME_HEADER_BYTES = 4096
BLOSC_CODECS = ("zstd", "lz4", "lz4hc", "zlib", "blosclz")
LOSSLESS_CODECS = (*BLOSC_CODECS, "zfp")
#: container format: magic, then <u4 header length, <u4 header CRC-32, JSON header, payload
MAGIC = b"HPCADJZ1"
_PREFIX = struct.Struct("<8sII")


class CodecError(ValueError):
    """An encoded block is corrupt (checksum, header or size mismatch) or cannot be decoded."""


def crc32(data) -> int:
    """CRC-32 of a bytes-like object or a C-contiguous array's bytes (unsigned 32-bit)."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return zlib.crc32(memoryview(data)) & 0xFFFFFFFF


@dataclass(frozen=True)
class EncodedBlock:
    """One rank block as stored: ``method`` (``raw``, ``blosc`` or ``zfp``), the block's shape and
    dtype, the payload chunks, their CRC-32 and the decoded block's, and the measured max error."""

    method: str
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[bytes, ...]
    stored_crc: int
    decoded_crc: int
    max_error: float = 0.0
    params: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Stored payload bytes."""
        return sum(len(c) for c in self.chunks)

    def header(self) -> dict:
        return {"method": self.method, "shape": list(self.shape), "dtype": self.dtype,
                "chunks": [len(c) for c in self.chunks], "stored_crc": self.stored_crc,
                "decoded_crc": self.decoded_crc, "max_error": self.max_error, "params": self.params}

    def _head(self) -> bytes:
        return json.dumps(self.header(), separators=(",", ":")).encode()

    def container_nbytes(self) -> int:
        """Bytes of :meth:`to_bytes`'s container."""
        return _PREFIX.size + len(self._head()) + self.nbytes

    def write_into(self, out) -> int:
        """Write :meth:`to_bytes`'s container at the start of the writable buffer ``out`` (no
        joined copy of the payload is made); the number of bytes written."""
        view = memoryview(out).cast("B")
        head = self._head()
        _PREFIX.pack_into(view, 0, MAGIC, len(head), crc32(head))
        pos = _PREFIX.size
        for part in (head, *self.chunks):
            view[pos:pos + len(part)] = part
            pos += len(part)
        return pos

    def to_bytes(self) -> bytes:
        """The self-describing container: magic, header length and CRC, JSON header, payload."""
        out = bytearray(self.container_nbytes())
        self.write_into(out)
        return bytes(out)

    @classmethod
    def from_bytes(cls, buf, copy: bool = True) -> "EncodedBlock":
        """Parse :meth:`to_bytes`'s container; :class:`CodecError` if it is truncated or corrupt.

        ``copy=False`` leaves the payload chunks as views of ``buf`` (no copy of the payload): the
        block is then only valid while ``buf`` is unchanged."""
        view = memoryview(buf).cast("B")
        if len(view) < _PREFIX.size:
            raise CodecError(f"encoded block truncated: {len(view)} bytes")
        magic, hlen, hcrc = _PREFIX.unpack_from(view)
        if magic != MAGIC:
            raise CodecError("not an hpcadj encoded block (bad magic)")
        end = _PREFIX.size + hlen
        if end > len(view) or crc32(view[_PREFIX.size:end]) != hcrc:
            raise CodecError("encoded block header corrupt or truncated")
        h = json.loads(bytes(view[_PREFIX.size:end]))
        chunks, pos = [], end
        for n in h["chunks"]:
            chunks.append(bytes(view[pos:pos + n]) if copy else view[pos:pos + n])
            pos += n
        if pos != len(view):
            raise CodecError(f"encoded block has {len(view)} bytes, header says {pos}")
        return cls(h["method"], tuple(h["shape"]), h["dtype"], tuple(chunks), h["stored_crc"],
                   h["decoded_crc"], float(h["max_error"]), h.get("params", {}))


def _payload_crc(chunks) -> int:
    crc = 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
    return crc & 0xFFFFFFFF


def _raw(a: np.ndarray, crc: int | None = None) -> EncodedBlock:
    data = a.tobytes()
    c = crc32(data)
    return EncodedBlock("raw", a.shape, a.dtype.str, (data,), c, c if crc is None else crc)


def _codec_threads() -> int:
    try:
        return max(1, int(os.environ.get("HPCADJ_CODEC_THREADS", "1")))
    except ValueError:
        raise ValueError("HPCADJ_CODEC_THREADS must be a positive integer") from None


def _set_blosc_threads() -> None:
    """One Blosc thread per process unless $HPCADJ_CODEC_THREADS says otherwise: MPI runs already
    put a rank on every core, and Blosc's default (one thread per core) would oversubscribe them."""
    from numcodecs import blosc

    blosc.set_nthreads(_codec_threads())


_BLOSC_LIBRARY: list = []


def _blosc_library():
    """libblosc (the C-Blosc 1 library Debian's numcodecs links), for compressing into a caller's
    buffer; None where it cannot be loaded by name (a numcodecs wheel with Blosc built in)."""
    if not _BLOSC_LIBRARY:
        try:
            lib = ctypes.CDLL("libblosc.so.1")
            fn = lib.blosc_compress_ctx
        except (OSError, AttributeError):
            lib = None
        else:
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
        _BLOSC_LIBRARY.append(lib)
    return _BLOSC_LIBRARY[0]


def scratch_bytes(field_bytes: int) -> int:
    """Bytes :meth:`Lossless.encode_into` needs for a field of ``field_bytes``: the field plus Blosc's
    overhead per chunk of :data:`CHUNK_BYTES`."""
    return int(field_bytes) + BLOSC_OVERHEAD * (1 + int(field_bytes) // CHUNK_BYTES)


class Codec:
    """Base codec: :meth:`encode` a block, :meth:`decode` it back; ``spec`` is its name."""

    spec = "none"
    lossy = False
    tolerance = 0.0

    def encode(self, block: np.ndarray) -> EncodedBlock:
        return _raw(np.ascontiguousarray(block))

    def decode(self, enc: EncodedBlock, out: np.ndarray | None = None) -> np.ndarray:
        """The decoded block (written into ``out`` when given); checks both checksums."""
        if _payload_crc(enc.chunks) != enc.stored_crc:
            raise CodecError(f"stored bytes fail their checksum ({enc.method} block {enc.shape})")
        dtype = np.dtype(enc.dtype)
        if out is None:
            out = np.empty(enc.shape, dtype)
        elif out.shape != tuple(enc.shape) or out.dtype != dtype or not out.flags.c_contiguous:
            raise CodecError(f"output array {out.shape} {out.dtype} does not fit block "
                             f"{tuple(enc.shape)} {dtype}")
        try:
            _DECODERS[enc.method](enc, out)
        except CodecError:
            raise
        except Exception as e:  # a corrupt payload that passed its CRC, or a codec library error
            raise CodecError(f"{enc.method} block cannot be decoded: {e}") from e
        if crc32(out) != enc.decoded_crc:
            raise CodecError(f"decoded {enc.method} block fails its checksum")
        return out

    def __repr__(self):
        return f"<codec {self.spec}>"


class Lossless(Codec):
    """Blosc byte-shuffle + ``cname`` (lz4 by default), or zfp reversible; bitwise round trip."""

    lossy = False

    def __init__(self, cname: str = "lz4"):
        from numcodecs import Blosc

        if cname not in LOSSLESS_CODECS:
            raise ValueError(f"unknown lossless codec {cname!r} (one of {', '.join(LOSSLESS_CODECS)})")
        if cname == "zfp":
            import zfpy  # noqa: F401  (fail at construction, not at the first write)
        self.cname = cname
        self.spec = "lossless" if cname == "lz4" else f"lossless:{cname}"
        self._blosc_name = blosc_name = "lz4" if cname == "zfp" else cname
        self.clevel, blocksize = BLOSC_SETTINGS[blosc_name]
        self._blosc = Blosc(cname=blosc_name, clevel=self.clevel, shuffle=Blosc.SHUFFLE,
                            blocksize=blocksize)
        _set_blosc_threads()

    def encode(self, block: np.ndarray) -> EncodedBlock:
        a = np.ascontiguousarray(block)
        if a.nbytes < MIN_COMPRESS_BYTES:
            return _raw(a)
        crc = crc32(a)
        if self.cname == "zfp" and _zfp_eligible(a):
            import zfpy

            data = zfpy.compress_numpy(a.reshape(_zfp_shape(a)))
            decoded = zfpy.decompress_numpy(data)
            if len(data) < a.nbytes and crc32(decoded) == crc and _same_bits(decoded, a):
                return EncodedBlock("zfp", a.shape, a.dtype.str, (data,), _payload_crc((data,)), crc,
                                    0.0, {"mode": "reversible"})
            del data, decoded  # not held while Blosc encodes (see transient_bytes)
        return self._encode(a, crc)

    def encode_into(self, block: np.ndarray, scratch: np.ndarray) -> EncodedBlock:
        """As :meth:`encode`, Blosc writing straight into ``scratch`` (a uint8 array of at least
        :func:`scratch_bytes` of the block) through libblosc's ``blosc_compress_ctx`` instead of
        into new buffers: the block's chunks are views of ``scratch``, valid until it is written
        again. Where libblosc cannot be called so (or for zfp), :meth:`encode`."""
        a = np.ascontiguousarray(block)
        lib = _blosc_library()
        if (lib is None or self.cname == "zfp" or a.nbytes < MIN_COMPRESS_BYTES or a.itemsize > 255
                or scratch.nbytes < scratch_bytes(a.nbytes)):
            return self.encode(a)
        crc = crc32(a)
        flat, base, pos, chunks = a.reshape(-1), scratch.ctypes.data, 0, []
        step = max(1, CHUNK_BYTES // a.itemsize)
        blocksize = BLOSC_SETTINGS[self._blosc_name][1]
        for i in range(0, flat.size, step):
            part = flat[i:i + step]
            room = part.nbytes + BLOSC_OVERHEAD
            n = lib.blosc_compress_ctx(self.clevel, 1, a.itemsize, part.nbytes, part.ctypes.data, base + pos,
                                       room, self._blosc_name.encode(), blocksize, _codec_threads())
            if n <= 0:
                raise CodecError(f"blosc_compress_ctx failed ({n}) on a block of {part.nbytes} bytes")
            chunks.append(memoryview(scratch)[pos:pos + n])
            pos += n
        return EncodedBlock("blosc", a.shape, a.dtype.str, tuple(chunks), _payload_crc(chunks), crc, 0.0,
                            {"cname": self._blosc_name, "clevel": self.clevel})

    def _encode(self, a: np.ndarray, decoded_crc: int) -> EncodedBlock:
        flat = a.reshape(-1)
        step = max(1, CHUNK_BYTES // a.itemsize)
        chunks = tuple(self._blosc.encode(flat[i:i + step]) for i in range(0, flat.size, step))
        return EncodedBlock("blosc", a.shape, a.dtype.str, chunks, _payload_crc(chunks),
                            decoded_crc, 0.0, {"cname": self._blosc_name, "clevel": self.clevel})


class Lossy(Codec):
    """zfp fixed-accuracy with an absolute pointwise bound ``tolerance``, verified on encode."""

    lossy = True

    def __init__(self, tolerance: float):
        import zfpy  # noqa: F401  (fail at construction, not at the first write)

        if not (math.isfinite(tolerance) and tolerance > 0):
            raise ValueError(f"lossy tolerance must be a positive number, got {tolerance!r}")
        self.tolerance = float(tolerance)
        self.spec = f"lossy:{tolerance:g}"
        self._fallback = Lossless()

    def encode(self, block: np.ndarray) -> EncodedBlock:
        import zfpy

        a = np.ascontiguousarray(block)
        if a.nbytes < MIN_COMPRESS_BYTES or not _zfp_eligible(a) or not np.isfinite(a).all():
            return self._fallback.encode(a)
        data = zfpy.compress_numpy(a.reshape(_zfp_shape(a)), tolerance=self.tolerance)
        decoded = zfpy.decompress_numpy(data).reshape(a.shape)
        decoded_crc = crc32(decoded)
        np.subtract(decoded, a, out=decoded)  # the error in place: no block-sized temporaries
        np.abs(decoded, out=decoded)
        err = float(np.max(decoded))
        del decoded
        if not err <= self.tolerance or len(data) >= a.nbytes:
            del data
            return self._fallback.encode(a)
        chunks = (data,)
        return EncodedBlock("zfp", a.shape, a.dtype.str, chunks, _payload_crc(chunks),
                            decoded_crc, err, {"tolerance": self.tolerance})


def _same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two arrays of one dtype hold the same bits (compared as unsigned integers of the
    item size: no byte copies of either, NaNs compare by their bits)."""
    as_int = np.dtype(f"u{x.dtype.itemsize}")
    return x.size == y.size and bool(np.array_equal(x.reshape(-1).view(as_int), y.reshape(-1).view(as_int)))


def transient_bytes(largest_field: int) -> int:
    """The most bytes encoding one field holds beside the field and its finished encoding, for a
    snapshot whose largest field (rank block) has ``largest_field`` bytes: the compressor's output
    buffer (the field's bytes plus Blosc's overhead) and the copy of its result (numcodecs slices
    it), or zfp's stream and its decoded check copy (lossy's error is taken in place in that copy;
    lossless:zfp's bit comparison adds an eighth): at most two fields, plus the headers."""
    largest = int(largest_field)
    return 2 * largest + 2 * BLOSC_OVERHEAD * (1 + largest // CHUNK_BYTES) + FRAME_HEADER_BYTES


def _zfp_eligible(a: np.ndarray) -> bool:
    return a.dtype in (np.float32, np.float64) and a.ndim >= 1 and a.size > 0


def _zfp_shape(a: np.ndarray) -> tuple[int, ...]:
    """zfp compresses 1- to 4-D arrays: more axes are folded into the slowest one."""
    return a.shape if a.ndim <= 4 else (-1, *a.shape[-3:])


def _decode_raw(enc: EncodedBlock, out: np.ndarray) -> None:
    if enc.nbytes != out.nbytes:
        raise CodecError(f"raw block has {enc.nbytes} bytes, expected {out.nbytes}")
    flat, pos = out.reshape(-1).view(np.uint8), 0
    for c in enc.chunks:
        flat[pos:pos + len(c)] = np.frombuffer(c, np.uint8)
        pos += len(c)


def _decode_blosc(enc: EncodedBlock, out: np.ndarray) -> None:
    from numcodecs import Blosc, blosc

    codec = Blosc(cname=enc.params.get("cname", "lz4"))
    flat = out.reshape(-1).view(np.uint8)
    pos = 0
    for c in enc.chunks:
        n = blosc.cbuffer_sizes(c)[0]
        if pos + n > flat.size:
            raise CodecError("blosc block decodes to more bytes than its shape holds")
        codec.decode(c, out=flat[pos:pos + n])
        pos += n
    if pos != flat.size:
        raise CodecError(f"blosc block decodes to {pos} bytes, expected {flat.size}")


def _decode_zfp(enc: EncodedBlock, out: np.ndarray) -> None:
    import zfpy

    decoded = zfpy.decompress_numpy(enc.chunks[0])
    if decoded.size != out.size or decoded.dtype != out.dtype:
        raise CodecError(f"zfp block decodes to {decoded.shape} {decoded.dtype}, "
                         f"expected {out.shape} {out.dtype}")
    np.copyto(out, decoded.reshape(out.shape))


_DECODERS = {"raw": _decode_raw, "blosc": _decode_blosc, "zfp": _decode_zfp}


def parse_codec(spec: str) -> Codec:
    """The codec a ``--compress`` spec names: ``none``, ``lossless[:CNAME]`` or ``lossy:TOL``.

    Raises ``ValueError`` with a one-line message for anything else (CLI exits 2 with it).
    """
    text = (spec or "").strip().lower()
    if text in ("none", "raw", ""):
        return Codec()
    kind, _, arg = text.partition(":")
    if kind == "lossless":
        return Lossless(arg or "lz4")
    if kind == "lossy":
        try:
            tol = float(arg)
        except ValueError:
            raise ValueError(f"--compress lossy:TOL needs a number TOL (absolute bound), "
                             f"got {spec!r}") from None
        return Lossy(tol)
    raise ValueError(f"unknown --compress {spec!r}: use none, lossless or lossy:TOL")


EncodedSnapshot = dict[str, EncodedBlock]


def encode_snapshot(snapshot: Snapshot, codec: Codec) -> EncodedSnapshot:
    """Every field of this rank's snapshot, encoded."""
    return {name: codec.encode(block) for name, block in snapshot.items()}


def decode_snapshot(encoded: EncodedSnapshot, out: Snapshot | None = None) -> Snapshot:
    """The snapshot back (into ``out``'s arrays where their shapes and dtypes fit)."""
    base = Codec()
    result = {}
    for name, enc in encoded.items():
        spare = None if out is None else out.get(name)
        if spare is not None and (spare.shape != tuple(enc.shape) or spare.dtype != np.dtype(enc.dtype)
                                  or not spare.flags.c_contiguous or not spare.flags.writeable):
            spare = None
        result[name] = base.decode(enc, spare)
    return result


def encoded_nbytes(encoded: EncodedSnapshot) -> int:
    """Stored payload bytes of an encoded snapshot (headers not counted)."""
    return sum(e.nbytes for e in encoded.values())


def max_error(encoded: EncodedSnapshot) -> float:
    """The largest measured pointwise error over the snapshot's fields (0 if all lossless)."""
    return max((e.max_error for e in encoded.values()), default=0.0)
