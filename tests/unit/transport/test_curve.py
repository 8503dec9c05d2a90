"""transport/curve.py: key files, the authorized-keys directory, fingerprints (spec §2.13)."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest
import zmq
from zmq.utils import z85

from pvgpu.transport import curve


def test_keygen_writes_a_public_file_and_a_0600_secret_file(tmp_path):
    pub, sec = curve.write_keypair(str(tmp_path / "keys"), "guest1")
    assert pub.endswith("guest1.key") and sec.endswith("guest1.key_secret")
    assert stat.S_IMODE(os.stat(sec).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "keys").st_mode) == 0o700
    pair = curve.read_secret_key(sec)
    public_only = curve.read_key_file(pub)
    assert public_only.secret is None and public_only.public == pair.public
    assert zmq.curve_public(pair.secret) == pair.public


def test_key_files_are_zeromq_certificates(tmp_path):
    """Keys interoperate with pyzmq's own certificate tools, both ways."""
    import zmq.auth
    pub, sec = curve.write_keypair(str(tmp_path), "a")
    assert zmq.auth.load_certificate(sec) == (curve.read_secret_key(sec).public,
                                              curve.read_secret_key(sec).secret)
    zpub, zsec = zmq.auth.create_certificates(str(tmp_path), "b")
    os.chmod(zsec, 0o600)
    assert curve.read_secret_key(zsec).public == zmq.auth.load_certificate(zpub)[0]


def test_keygen_never_overwrites(tmp_path):
    curve.write_keypair(str(tmp_path), "k")
    with pytest.raises(curve.CurveKeyError, match="exists"):
        curve.write_keypair(str(tmp_path), "k")


def test_a_secret_file_others_can_read_is_refused(tmp_path):
    _pub, sec = curve.write_keypair(str(tmp_path), "k")
    os.chmod(sec, 0o644)
    with pytest.raises(curve.CurveKeyError, match="chmod 600"):
        curve.read_secret_key(sec)


def test_a_public_file_is_not_a_secret_key(tmp_path):
    pub, _sec = curve.write_keypair(str(tmp_path), "k")
    with pytest.raises(curve.CurveKeyError, match="no secret key"):
        curve.read_secret_key(pub)


@pytest.mark.parametrize("text", ["", "not a certificate\n", 'public-key = "short"\n'])
def test_malformed_key_files_are_refused(tmp_path, text):
    p = tmp_path / "bad.key"
    p.write_text(text)
    with pytest.raises(curve.CurveKeyError):
        curve.read_key_file(str(p))


def test_a_mismatched_pair_is_refused(tmp_path):
    a, b = curve.generate(), curve.generate()
    p = tmp_path / "x.key_secret"
    p.write_text(f'curve\n    public-key = "{a.public.decode()}"\n'
                 f'    secret-key = "{b.secret.decode()}"\n')
    os.chmod(p, 0o600)
    with pytest.raises(curve.CurveKeyError, match="does not belong"):
        curve.read_key_file(str(p))


def test_fingerprint_is_the_first_8_bytes_of_sha256_of_the_raw_key():
    pair = curve.generate()
    raw = z85.decode(pair.public)
    assert curve.fingerprint(pair.public) == hashlib.sha256(raw).digest()[:8].hex()
    assert curve.fingerprint(raw) == pair.fingerprint
    assert len(pair.fingerprint) == 16


def test_guests_name_keys_by_file_or_by_z85_text(tmp_path):
    pub, sec = curve.write_keypair(str(tmp_path), "k")
    pair = curve.read_secret_key(sec)
    assert curve.parse_public_key(pub).public == pair.public
    assert curve.parse_public_key(sec).public == pair.public
    assert curve.parse_public_key(pair.public.decode()).public == pair.public
    by_text = curve.parse_secret_key(pair.secret.decode())
    assert (by_text.public, by_text.secret) == (pair.public, pair.secret)
    assert curve.parse_secret_key(sec).secret == pair.secret
    with pytest.raises(curve.CurveKeyError):
        curve.parse_secret_key(str(tmp_path / "missing"))
    for bad in ("~" * curve.KEY_Z85_LEN, "#" * curve.KEY_Z85_LEN):  # not Z85; overflows
        with pytest.raises(curve.CurveKeyError):
            curve.parse_public_key(bad)


def test_authorized_keys_reads_public_certificates_and_reports_revocations(tmp_path):
    keys = tmp_path / "keys"
    auth = tmp_path / "authorized"
    auth.mkdir()
    a_pub, a_sec = curve.write_keypair(str(keys), "a")
    b_pub, _ = curve.write_keypair(str(keys), "b")
    c_pub, _ = curve.write_keypair(str(keys), "c")
    for p in (a_pub, b_pub):
        os.link(p, auth / os.path.basename(p))
    (auth / "junk.key").write_text("nothing here")  # skipped, authorizes nothing
    (auth / "README").write_text("not a key")
    os.link(a_sec, auth / "a.key_secret")  # secret files are not read
    ak = curve.AuthorizedKeys(str(auth))
    a, b, c = (z85.decode(curve.read_key_file(p).public) for p in (a_pub, b_pub, c_pub))
    assert len(ak) == 2
    assert ak.lookup(a) == curve.fingerprint(a) and ak.lookup(b) == curve.fingerprint(b)
    assert ak.lookup(c) is None

    os.unlink(auth / "b.key")
    os.link(c_pub, auth / "c.key")
    assert ak.reload() == {curve.fingerprint(b)}
    assert ak.lookup(b) is None and ak.lookup(c) == curve.fingerprint(c)
    assert ak.revoked == {curve.fingerprint(b)}
    os.link(b_pub, auth / "b.key")  # authorized again: no longer revoked
    assert ak.reload() == set() and ak.revoked == set()


def test_an_unreadable_authorized_directory_is_an_error(tmp_path):
    with pytest.raises(curve.CurveKeyError, match="authorized-keys directory"):
        curve.AuthorizedKeys(str(tmp_path / "missing"))


def test_guest_keys_from_arguments_or_environment_on_tcp_only(tmp_path):
    host_pub, host_sec = curve.write_keypair(str(tmp_path), "host")
    _g_pub, g_sec = curve.write_keypair(str(tmp_path), "g")
    host, g = curve.read_secret_key(host_sec), curve.read_secret_key(g_sec)
    env = {curve.SERVER_KEY_ENV: host.public.decode(), curve.CLIENT_KEY_ENV: g_sec}
    server, client = curve.guest_keys("tcp://h:1", env=env)
    assert server == host.public and (client.public, client.secret) == (g.public, g.secret)
    server, client = curve.guest_keys("tcp://h:1", host_pub, g.secret.decode(), env={})
    assert server == host.public and client.secret == g.secret
    assert curve.guest_keys("ipc:///x/h.sock", env=env) == (None, None)  # ipc: no CURVE
    assert curve.guest_keys("tcp://h:1", env={}) == (None, None)
    with pytest.raises(curve.CurveKeyError, match="PVGPU_CLIENT_KEY is missing"):
        curve.guest_keys("tcp://h:1", env={curve.SERVER_KEY_ENV: host_pub})


def test_a_failed_reload_keeps_the_keys(tmp_path):
    auth = tmp_path / "authorized"
    auth.mkdir()
    pub, _ = curve.write_keypair(str(tmp_path / "keys"), "a")
    os.link(pub, auth / "a.key")
    ak = curve.AuthorizedKeys(str(auth))
    auth.rename(tmp_path / "moved")
    with pytest.raises(curve.CurveKeyError):
        ak.reload()
    assert len(ak) == 1 and ak.revoked == set()
