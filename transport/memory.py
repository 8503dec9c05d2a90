"""Guest physical memory: the address space descriptors point into (spec/pvgpu.md §3).

Three models share one interface, so one virtqueue implementation runs over all of them:

  GuestMemory          a flat address space [0, size) over a buffer passed in (a bytearray,
                       a 1-D uint8 numpy array) or allocated; what unit tests drive.
  SharedGuestMemory    memory shared by guest and host processes: the guest creates it, the
                       host attaches to it by name and reads/writes in place (the "shared"
                       model, like vhost-user's SET_MEM_TABLE regions).
  InlineGuestMemory    a private array with dirty tracking (the "inline" model): each side
                       collects the ranges it wrote with take_dirty(), ships them as patches
                       (gpa, frame) in a kick or call, and the peer applies them with
                       apply_patches(); results are byte-identical to the shared model.

Dirty tracking rule: write() and write_u16/u32/u64 mark the range dirty (in the inline
model); view() does not — code that writes through a view calls mark_dirty() itself.
Writes by apply_patches() are never marked (they came from the peer).

Hot path: ``mv`` is a memoryview over ``buf``; the virtqueue code uses struct.unpack_from /
pack_into on it directly after validating ring addresses once. The scalar helpers here do
the same plus a range check.

Shared-model trust: a guest that could shrink the memory (ftruncate) after the host
mapped it would make the host's next access fault (SIGBUS) and take every guest down. On
Linux the guest therefore creates a memfd sealed with F_SEAL_SHRINK | F_SEAL_GROW |
F_SEAL_SEAL and announces it as /proc/<pid>/fd/<n>; the host opens that path, checks the
seals and refuses anything unsealed, including POSIX shm names (spec MEM-SHARED-*). A
memfd has no name in /dev/shm, so nothing can leak. Where memfd does not exist, POSIX shm
is the fallback, with the SIGBUS exposure documented in the spec. A path names *some*
process's descriptor, not necessarily the announcing guest's: the host checks what it is
before opening it for I/O, and the backend then requires the session's challenge inside
(spec CTL-MEMTABLE-5), which only the memory's owner can have written.
"""

from __future__ import annotations

import mmap
import os
import stat

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]
import re
import secrets
import struct
import weakref

import numpy as np

from pvgpu.transport.errors import GuestMemoryError

try:  # the stdlib C module behind multiprocessing.shared_memory, without its resource_tracker
    import _posixshmem
except ImportError:  # pragma: no cover - non-CPython / exotic platforms
    _posixshmem = None

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

SHM_PREFIX = "pvgpu-"
HAVE_MEMFD = hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS") if fcntl else False
MEMFD_SEALS = (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL) if HAVE_MEMFD else 0
_MEMFD_PATH_RE = re.compile(r"/proc/(\d{1,10})/fd/(\d{1,10})")
_SHM_NAME_RE = re.compile(r"pvgpu-[A-Za-z0-9_.-]{1,200}")
_SHM_DIR = "/dev/shm"


def as_byte_view(data) -> memoryview:
    """A flat unsigned-byte memoryview of a bytes-like object or a numpy array."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    mv = memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


class GuestMemory:
    """A flat guest-physical address space [0, size) over one contiguous byte buffer.

    ``backing`` is a size in bytes (zero-filled numpy memory is allocated), a writable
    bytes-like object (bytearray, mmap, memoryview; shared, not copied) or a 1-D uint8
    C-contiguous numpy array (used as is).
    """

    tracks_dirty = False  # whether writes are recorded for take_dirty() (the inline model)

    def __init__(self, backing):
        if isinstance(backing, bool):
            raise TypeError("backing must be a size or a writable buffer")
        if isinstance(backing, int):
            if backing < 0:
                raise ValueError(f"negative guest memory size {backing}")
            buf = np.zeros(backing, dtype=np.uint8)
        elif isinstance(backing, np.ndarray):
            if backing.dtype != np.uint8 or backing.ndim != 1 or not backing.flags.c_contiguous:
                raise ValueError("a numpy backing must be a 1-D C-contiguous uint8 array")
            if not backing.flags.writeable:
                raise ValueError("a numpy backing must be writable")
            buf = backing
        else:
            buf = np.frombuffer(backing, dtype=np.uint8)
            if not buf.flags.writeable:
                raise ValueError("the backing buffer must be writable")
        self._set_buffer(buf)

    def _set_buffer(self, buf: np.ndarray) -> None:
        self.buf = buf
        self.size = int(buf.size)
        self.mv = memoryview(buf)  # type: ignore[arg-type]  # numpy: a Buffer from Python 3.12

    # ------------------------------------------------------------------ ranges
    def check_range(self, gpa: int, n: int) -> bool:
        """True if [gpa, gpa+n) lies inside guest memory (Python ints: no overflow)."""
        return 0 <= gpa and 0 <= n and gpa <= self.size - n

    def _require(self, gpa: int, n: int) -> None:
        if not (0 <= gpa and 0 <= n and gpa <= self.size - n):
            raise GuestMemoryError(
                f"guest range [{gpa:#x}, +{n:#x}) outside guest memory of {self.size:#x} bytes")

    # ------------------------------------------------------------------ bulk access
    def read(self, gpa: int, n: int) -> bytes:
        if not (0 <= gpa and 0 <= n and gpa <= self.size - n):
            self._require(gpa, n)
        return self.mv[gpa:gpa + n].tobytes()

    def write(self, gpa: int, data) -> int:
        """Copy ``data`` (bytes-like or numpy array) to ``gpa``; returns the byte count."""
        src = data if type(data) is bytes else as_byte_view(data)
        n = len(src)  # a flat byte view: its length is its size in bytes
        if not (0 <= gpa and gpa <= self.size - n):
            self._require(gpa, n)
        self.mv[gpa:gpa + n] = src
        return n

    def view(self, gpa: int, n: int) -> np.ndarray:
        """A writable uint8 view of [gpa, gpa+n), zero-copy. Does not mark dirty."""
        self._require(gpa, n)
        return self.buf[gpa:gpa + n]

    # ------------------------------------------------------------------ scalars (hot path)
    def read_u16(self, gpa: int) -> int:
        if gpa < 0 or gpa > self.size - 2:
            self._require(gpa, 2)
        return _U16.unpack_from(self.mv, gpa)[0]

    def read_u32(self, gpa: int) -> int:
        if gpa < 0 or gpa > self.size - 4:
            self._require(gpa, 4)
        return _U32.unpack_from(self.mv, gpa)[0]

    def read_u64(self, gpa: int) -> int:
        if gpa < 0 or gpa > self.size - 8:
            self._require(gpa, 8)
        return _U64.unpack_from(self.mv, gpa)[0]

    def write_u16(self, gpa: int, value: int) -> None:
        if gpa < 0 or gpa > self.size - 2:
            self._require(gpa, 2)
        _U16.pack_into(self.mv, gpa, value)

    def write_u32(self, gpa: int, value: int) -> None:
        if gpa < 0 or gpa > self.size - 4:
            self._require(gpa, 4)
        _U32.pack_into(self.mv, gpa, value)

    def write_u64(self, gpa: int, value: int) -> None:
        if gpa < 0 or gpa > self.size - 8:
            self._require(gpa, 8)
        _U64.pack_into(self.mv, gpa, value)

    # ------------------------------------------------------------------ dirty tracking
    def mark_dirty(self, gpa: int, n: int) -> None:
        """Record that [gpa, gpa+n) was written through a view. No-op unless inline."""

    def take_dirty(self) -> list:
        """Merged, sorted (gpa, n) ranges written since the last call. [] unless inline."""
        return []


class InlineGuestMemory(GuestMemory):
    """Private guest memory with dirty tracking, for the inline model.

    np.zeros maps lazily zeroed pages, so a large mostly-unused guest memory costs little.
    Both sides hold one: the guest's is the real memory, the host's is a mirror kept
    current by patches.
    """

    tracks_dirty = True

    def __init__(self, size: int):
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError("InlineGuestMemory takes a size in bytes")
        super().__init__(size)
        self._dirty: list = []

    def write(self, gpa: int, data) -> int:
        n = GuestMemory.write(self, gpa, data)
        if n:
            self._dirty.append((gpa, n))
        return n

    def write_u16(self, gpa: int, value: int) -> None:
        GuestMemory.write_u16(self, gpa, value)
        self._dirty.append((gpa, 2))

    def write_u32(self, gpa: int, value: int) -> None:
        GuestMemory.write_u32(self, gpa, value)
        self._dirty.append((gpa, 4))

    def write_u64(self, gpa: int, value: int) -> None:
        GuestMemory.write_u64(self, gpa, value)
        self._dirty.append((gpa, 8))

    def mark_dirty(self, gpa: int, n: int) -> None:
        if not (0 <= gpa and 0 <= n and gpa <= self.size - n):
            self._require(gpa, n)
        if n:
            self._dirty.append((gpa, n))

    def take_dirty(self) -> list:
        """Sorted ranges with overlapping and adjacent ones merged; clears the record."""
        dirty = self._dirty
        if not dirty:
            return []
        self._dirty = []
        dirty.sort()
        merged = []
        cur_start, cur_n = dirty[0]
        cur_end = cur_start + cur_n
        for start, n in dirty[1:]:
            if start <= cur_end:
                end = start + n
                if end > cur_end:
                    cur_end = end
            else:
                merged.append((cur_start, cur_end - cur_start))
                cur_start, cur_end = start, start + n
        merged.append((cur_start, cur_end - cur_start))
        return merged

    def apply_patches(self, patches, frames) -> None:
        """Write the peer's patches: each is [gpa, frame_index] naming ``frames[frame_index]``.

        Every patch is validated before any byte is written (all or nothing). The writes
        are not marked dirty. Raises GuestMemoryError naming the first bad patch.
        """
        if not isinstance(patches, (list, tuple)):
            raise GuestMemoryError(f"patches must be a list, not {type(patches).__name__}")
        nframes = len(frames)
        plan = []
        for i, patch in enumerate(patches):
            if not isinstance(patch, (list, tuple)) or len(patch) != 2:
                raise GuestMemoryError(f"patch {i}: expected [gpa, frame_index], got {patch!r}")
            gpa, index = patch
            if type(gpa) is not int or type(index) is not int:
                raise GuestMemoryError(f"patch {i}: gpa and frame_index must be integers")
            if not 0 <= index < nframes:
                raise GuestMemoryError(
                    f"patch {i}: frame index {index} out of range ({nframes} frames)")
            try:
                src = as_byte_view(frames[index])
            except (TypeError, ValueError) as e:
                raise GuestMemoryError(f"patch {i}: frame {index} is not a byte buffer: {e}")
            n = src.nbytes
            if not self.check_range(gpa, n):
                raise GuestMemoryError(
                    f"patch {i}: [{gpa:#x}, +{n:#x}) outside guest memory of {self.size:#x} bytes")
            plan.append((gpa, n, src))
        mv = self.mv
        for gpa, n, src in plan:
            mv[gpa:gpa + n] = src


def _shm_path(name: str) -> str:
    return os.path.join(_SHM_DIR, name)


def _map_shared(fd: int, name: str, size: int) -> mmap.mmap:
    """Map `size` bytes of an open shared object read/write, checking it is large enough."""
    try:
        actual = os.fstat(fd).st_size
        if actual < size:
            raise GuestMemoryError(
                f"shared memory {name!r} has {actual} bytes, fewer than the {size} announced")
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as e:
        raise GuestMemoryError(f"cannot map shared memory {name!r}: {e}") from e


def _shm_open(name: str, flags: int, mode: int = 0o600) -> int:
    if _posixshmem is not None:
        return _posixshmem.shm_open("/" + name, flags, mode)
    return os.open(_shm_path(name), flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def _shm_unlink(name: str) -> None:
    """Unlink a segment name, ignoring one that is already gone."""
    try:
        if _posixshmem is not None:
            _posixshmem.shm_unlink("/" + name)
        else:
            os.unlink(_shm_path(name))
    except FileNotFoundError:
        pass


class SharedGuestMemory(GuestMemory):
    """Guest memory in a POSIX shared-memory segment, mapped by guest and host.

    The guest calls ``create(size)``; the host calls ``attach(name, size)``, which maps the
    segment and immediately unlinks its name, so nothing leaks in /dev/shm if either
    process dies; both mappings stay valid. (Not multiprocessing.shared_memory: its
    resource_tracker unlinks segments behind our back before Python 3.13.)

    ``close()`` unmaps. If numpy views obtained from ``view()``/``buf`` are still alive,
    the mapping cannot be unmapped yet (mmap.close raises BufferError); close() then drops
    this object's references and leaves the unmapping to the garbage collector when the
    last view dies. The object itself then behaves as zero-sized memory.
    """

    def __init__(self, name: str, mm: mmap.mmap, size: int, owner: bool, fd: int | None = None):
        self._name = name
        self._mmap: mmap.mmap | None = mm
        self._owner = owner
        self._fd = fd  # the guest keeps its memfd open: the host opens it through /proc
        self._set_buffer(np.frombuffer(mm, dtype=np.uint8, count=size))
        # The creator of a POSIX segment unlinks it on garbage collection / interpreter
        # exit too, so an unattached segment does not outlive a guest that forgot close().
        self._finalizer = (weakref.finalize(self, _shm_unlink, name)
                           if owner and fd is None else None)

    @classmethod
    def create(cls, size: int, *, sealed: bool | None = None) -> "SharedGuestMemory":
        """Guest side: new zero-filled memory. sealed (default: where the platform has
        memfd) makes a sealed memfd named /proc/<pid>/fd/<n>; otherwise a POSIX segment
        named pvgpu-<pid>-<random hex>."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise GuestMemoryError(f"shared guest memory size must be a positive int, not {size!r}")
        if sealed is None:
            sealed = HAVE_MEMFD
        if sealed:
            return cls._create_memfd(size)
        for _ in range(8):
            name = f"{SHM_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
            try:
                fd = _shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR)
            except FileExistsError:
                continue
            break
        else:  # pragma: no cover - 64 random bits collided eight times
            raise GuestMemoryError("could not create a unique shared-memory name")
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            _shm_unlink(name)
            raise GuestMemoryError(f"cannot create shared memory of {size} bytes: {e}") from e
        finally:
            os.close(fd)
        return cls(name, mm, size, owner=True)

    @classmethod
    def _create_memfd(cls, size: int) -> "SharedGuestMemory":
        if not HAVE_MEMFD:
            raise GuestMemoryError("this platform has no sealable memfd")
        fd = os.memfd_create(f"{SHM_PREFIX}{os.getpid()}", os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, MEMFD_SEALS)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            os.close(fd)
            raise GuestMemoryError(f"cannot create sealed memory of {size} bytes: {e}") from e
        return cls(f"/proc/{os.getpid()}/fd/{fd}", mm, size, owner=True, fd=fd)

    @classmethod
    def attach(cls, name: str, size: int, *, require_sealed: bool | None = None
               ) -> "SharedGuestMemory":
        """Host side: map the guest's memory of at least ``size`` bytes. A sealed memfd
        (/proc/<pid>/fd/<n>) must carry F_SEAL_SHRINK; a POSIX segment name is accepted
        only when require_sealed is false (default: false only without memfd support),
        and is unlinked at once."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise GuestMemoryError(f"shared guest memory size must be a positive int, not {size!r}")
        if require_sealed is None:
            require_sealed = HAVE_MEMFD
        if isinstance(name, str) and _MEMFD_PATH_RE.fullmatch(name):
            return cls._attach_memfd(name, size)
        if require_sealed:
            raise GuestMemoryError(
                f"shared memory {name!r} is not a sealed memfd (/proc/<pid>/fd/<n> with "
                "F_SEAL_SHRINK); unsealed memory could be shrunk under the host")
        if isinstance(name, str) and name.startswith("/"):
            name = name[1:]
        if not isinstance(name, str) or not _SHM_NAME_RE.fullmatch(name):
            raise GuestMemoryError(f"invalid shared-memory name {name!r}")
        try:
            fd = _shm_open(name, os.O_RDWR)
        except OSError as e:
            raise GuestMemoryError(f"cannot open shared memory {name!r}: {e}") from e
        try:
            mm = _map_shared(fd, name, size)
        finally:
            os.close(fd)
        _shm_unlink(name)
        return cls(name, mm, size, owner=False)

    @classmethod
    def _attach_memfd(cls, path: str, size: int) -> "SharedGuestMemory":
        if not HAVE_MEMFD:
            raise GuestMemoryError("this platform has no sealable memfd")
        # The path names a descriptor of some process: look at what it is (O_PATH opens
        # nothing) before opening it for I/O, which for a device or a FIFO has effects.
        try:
            ref = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as e:
            raise GuestMemoryError(f"cannot open shared memory {path!r}: {e}") from e
        try:
            if not stat.S_ISREG(os.fstat(ref).st_mode):
                raise GuestMemoryError(f"{path!r} is not a memory file (a sealed memfd)")
            fd = os.open(f"/proc/self/fd/{ref}", os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise GuestMemoryError(f"cannot open shared memory {path!r}: {e}") from e
        finally:
            os.close(ref)
        try:
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                raise GuestMemoryError(f"{path!r} is not a sealable memfd") from None
            if not seals & fcntl.F_SEAL_SHRINK:
                raise GuestMemoryError(
                    f"shared memory {path!r} is not sealed against shrinking (F_SEAL_SHRINK)")
            mm = _map_shared(fd, path, size)
        finally:
            os.close(fd)
        return cls(path, mm, size, owner=False)

    @property
    def name(self) -> str:
        """The segment name without the leading slash (what set_mem_table carries)."""
        return self._name

    @property
    def closed(self) -> bool:
        return self._mmap is None

    def close(self) -> None:
        """Unmap (deferred while views are alive); the creator also unlinks the name (or
        closes its memfd)."""
        if self._finalizer is not None:
            self._finalizer()  # unlink, ignoring a name the host already removed
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        mm = self._mmap
        if mm is None:
            return
        self._mmap = None
        try:
            self.mv.release()
        except BufferError:
            pass  # something re-exported our memoryview; the GC releases it later
        self._set_buffer(np.zeros(0, dtype=np.uint8))
        try:
            mm.close()
        except BufferError:
            pass  # views still exported; the mmap is unmapped when the last one dies

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
