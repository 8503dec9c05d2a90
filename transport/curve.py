"""CurveZMQ keys of the control channel (spec/pvgpu.md §2.13): key files, the host's
authorized-keys directory and key fingerprints.

A CURVE key pair is two 32-byte keys, written as 40 characters of Z85 (ZeroMQ RFC 32).
Key files use ZeroMQ's certificate format (the one `zmq.auth.create_certificates` and
czmq's `zcert` write), so keys made by other ZeroMQ tools work too:

    NAME.key          public certificate: ``public-key = "<z85>"``, safe to hand out
    NAME.key_secret   secret certificate: the public and the ``secret-key = "<z85>"``,
                      mode 0600; a secret file that others can read is refused

The host's **authorized-keys directory** holds one public certificate (``*.key``) per
guest allowed to connect; `AuthorizedKeys.reload()` re-reads it (the host does on
SIGHUP). A key's **fingerprint** is the first 8 bytes of the SHA-256 of its 32 raw
bytes, in hex: what logs and `stats()` show of a session's key.

A guest names keys as files or as text (`parse_public_key`, `parse_secret_key`): a path
to a certificate, or the 40-character Z85 text itself.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import stat
import struct

import zmq
from zmq.utils import z85

from pvgpu.transport.errors import TransportError

log = logging.getLogger(__name__)

KEY_Z85_LEN = 40  # characters of a 32-byte key in Z85
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"

_PUBLIC_BANNER = """#   ****  Generated on {0} by pvgpu keygen  ****
#   ZeroMQ CURVE Public Certificate
#   Give it to the host that should accept this key (its --authorized-keys directory).

"""
_SECRET_BANNER = """#   ****  Generated on {0} by pvgpu keygen  ****
#   ZeroMQ CURVE **Secret** Certificate
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

"""


class CurveKeyError(TransportError, ValueError):
    """A key, key file or key directory that cannot be used (the message says why)."""


def fingerprint(public_key: bytes) -> str:
    """Short fingerprint of a public key (Z85 text or 32 raw bytes): 16 hex digits."""
    return hashlib.sha256(_raw(public_key)).digest()[:8].hex()


def _raw(key: bytes) -> bytes:
    """32 raw key bytes from Z85 text or raw bytes."""
    if len(key) == 32:
        return bytes(key)
    return z85.decode(_z85(key, "key"))


def _z85(text, what: str) -> bytes:
    """Validated 40-character Z85 key text as bytes."""
    if isinstance(text, str):
        text = text.encode("ascii", "replace")
    text = bytes(text).strip()
    if len(text) != KEY_Z85_LEN:
        raise CurveKeyError(f"{what} is not a {KEY_Z85_LEN}-character Z85 key")
    try:
        if len(z85.decode(text)) != 32:
            raise ValueError
    except (ValueError, KeyError, IndexError, struct.error):
        raise CurveKeyError(f"{what} is not valid Z85 text") from None
    return text


class KeyPair:
    """A CURVE key pair as Z85 text (bytes); `secret` is None for a public key only."""

    __slots__ = ("public", "secret")

    def __init__(self, public: bytes, secret: bytes | None = None):
        self.public = public
        self.secret = secret

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public)

    def __repr__(self):
        return f"<KeyPair {self.fingerprint}{' with secret' if self.secret else ''}>"


def generate() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public, secret)


def write_keypair(directory: str, name: str, pair: KeyPair | None = None) -> tuple:
    """Write NAME.key and NAME.key_secret (mode 0600) into directory (created 0700 if
    missing); never overwrites. -> (public_path, secret_path)."""
    pair = pair or generate()
    if not name or os.sep in name or name.startswith("."):
        raise CurveKeyError(f"key name {name!r} must be a plain file name")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    base = os.path.join(directory, name)
    public_path, secret_path = base + PUBLIC_SUFFIX, base + SECRET_SUFFIX
    for path in (public_path, secret_path):
        if os.path.lexists(path):
            raise CurveKeyError(f"{path} exists; not overwriting a key")
    now = datetime.datetime.now().isoformat(timespec="seconds")
    _write(secret_path, _SECRET_BANNER.format(now), pair, 0o600)
    _write(public_path, _PUBLIC_BANNER.format(now), KeyPair(pair.public), 0o644)
    return public_path, secret_path


def _write(path: str, banner: str, pair: KeyPair, mode: int) -> None:
    text = banner + "metadata\ncurve\n" + f'    public-key = "{pair.public.decode()}"\n'
    if pair.secret is not None:
        text += f'    secret-key = "{pair.secret.decode()}"\n'
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)  # the umask may have taken bits the public file should have


def read_key_file(path: str) -> KeyPair:
    """Read a certificate; a secret one must not be readable by group or others."""
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            data = f.read(64 * 1024)
    except OSError as e:
        raise CurveKeyError(f"cannot read key file {path}: {e.strerror}") from None
    fields = {}
    for line in data.splitlines():
        line = line.strip()
        if line.startswith(b"#") or b"=" not in line:
            continue
        k, _, v = line.partition(b"=")
        fields[k.strip()] = v.strip().strip(b"'\"")
    if b"public-key" not in fields:
        raise CurveKeyError(f"{path} is not a ZeroMQ certificate (no public-key)")
    public = _z85(fields[b"public-key"], f"the public key in {path}")
    secret = fields.get(b"secret-key")
    if secret is not None:
        secret = _z85(secret, f"the secret key in {path}")
        if st.st_mode & 0o077:
            raise CurveKeyError(f"{path} holds a secret key but its mode is "
                            f"{stat.S_IMODE(st.st_mode):04o}: make it 0600 (chmod 600)")
        if zmq.curve_public(secret) != public:
            raise CurveKeyError(f"{path}: the public key does not belong to the secret key")
    return KeyPair(public, secret)


def read_secret_key(path: str) -> KeyPair:
    pair = read_key_file(path)
    if pair.secret is None:
        raise CurveKeyError(f"{path} holds no secret key (use the {SECRET_SUFFIX} file)")
    return pair


def parse_public_key(value: str) -> KeyPair:
    """A public key named by a guest: 40 characters of Z85, or a certificate file (public
    or secret; only the public key is taken)."""
    if len(value.strip()) == KEY_Z85_LEN and not os.path.exists(value):
        return KeyPair(_z85(value, "the server key"))
    return KeyPair(read_key_file(value).public)


def parse_secret_key(value: str) -> KeyPair:
    """A key pair named by a guest: a secret certificate file, or the 40-character Z85
    text of the secret key (the public key is derived from it)."""
    if len(value.strip()) == KEY_Z85_LEN and not os.path.exists(value):
        secret = _z85(value, "the client key")
        return KeyPair(zmq.curve_public(secret), secret)
    return read_secret_key(value)


class AuthorizedKeys:
    """The public keys allowed to connect: every ``*.key`` certificate in a directory.
    A file that does not parse authorizes nothing (logged and skipped)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.keys: dict = {}  # raw 32-byte public key -> fingerprint
        self.ever: set = set()  # fingerprints authorized at some time since start
        self.reload()

    def reload(self) -> set:
        """Re-read the directory -> the fingerprints authorized before and not any more."""
        try:
            names = sorted(os.listdir(self.directory))
        except OSError as e:
            raise CurveKeyError(f"cannot read the authorized-keys directory {self.directory}: "
                            f"{e.strerror}") from None
        keys = {}
        for name in names:
            if not name.endswith(PUBLIC_SUFFIX):
                continue
            path = os.path.join(self.directory, name)
            try:
                pair = read_key_file(path)
            except CurveKeyError as e:
                log.warning("authorized keys: skipped %s: %s", path, e)
                continue
            raw = z85.decode(pair.public)
            keys[raw] = fingerprint(raw)
        before = set(self.keys.values())
        self.keys = keys
        now = set(keys.values())
        self.ever |= now
        if not keys:
            log.warning("authorized keys: %s lists no key: no guest can connect over CURVE",
                        self.directory)
        return before - now

    @property
    def revoked(self) -> set:
        """Fingerprints authorized at some time since start and not now."""
        return self.ever - set(self.keys.values())

    def lookup(self, raw_public_key: bytes):
        """-> the key's fingerprint if it is authorized, else None."""
        return self.keys.get(raw_public_key)

    def __len__(self):
        return len(self.keys)


class ServerKeys:
    """The host's CURVE configuration: its key pair and the authorized guest keys."""

    def __init__(self, pair: KeyPair, authorized: AuthorizedKeys):
        if pair.secret is None:
            raise CurveKeyError("the host needs its secret key")
        self.pair = pair
        self.authorized = authorized

    @classmethod
    def load(cls, secret_key_file: str, authorized_dir: str) -> "ServerKeys":
        return cls(read_secret_key(secret_key_file), AuthorizedKeys(authorized_dir))


SERVER_KEY_ENV = "PVGPU_SERVER_KEY"
CLIENT_KEY_ENV = "PVGPU_CLIENT_KEY"


def guest_keys(endpoint: str, server_key=None, client_key=None, env=os.environ) -> tuple:
    """The CURVE keys of a guest's connection -> (host public key Z85, client KeyPair),
    or (None, None) for no CURVE. Keys apply to tcp endpoints only (ipc ones need none).
    Each key is the argument if given, else the environment variable
    (PVGPU_SERVER_KEY, PVGPU_CLIENT_KEY); a value is a file path or Z85 text (see
    parse_public_key / parse_secret_key). Naming one of the two keys and not the
    other is an error."""
    if not endpoint.startswith("tcp://"):
        return None, None
    server_key = server_key if server_key is not None else env.get(SERVER_KEY_ENV) or None
    client_key = client_key if client_key is not None else env.get(CLIENT_KEY_ENV) or None
    if server_key is None and client_key is None:
        return None, None
    if server_key is None or client_key is None:
        missing = "server_key / PVGPU_SERVER_KEY" if server_key is None else \
            "client_key / PVGPU_CLIENT_KEY"
        raise CurveKeyError(f"CURVE needs the host's public key and this guest's key pair: "
                            f"{missing} is missing")
    return (parse_public_key(os.fsdecode(server_key)).public,
            parse_secret_key(os.fsdecode(client_key)))
