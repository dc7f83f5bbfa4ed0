"""Synthetic secrets, built from each provider's published format description.

Nothing here reads the rule files or reuses their regexes: a secret is assembled from its
documented parts (prefix, alphabet, length, checksum, encoding of a structured payload), so
the corpus tests the rules rather than echoing them. Every value is random and fake.

A `Plant` is one secret ready to be written into a document: the pieces of text it is made
of (only the pieces flagged secret are labelled), the variable name words a writer would
assign it to, the rule family and the rule id we expect to catch it, and whether it needs
its name to be recognisable at all (a bare 32-hex Datadog key is indistinguishable from an
MD5 sum, so it is only ever planted next to its name).
"""
import base64
import json
import string
import zlib
from dataclasses import dataclass, field

ALNUM = string.ascii_letters + string.digits
LOWER_ALNUM = string.ascii_lowercase + string.digits
UPPER_ALNUM = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
BASE32 = string.ascii_uppercase + "234567"
BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
BCRYPT = "./" + ALNUM


@dataclass
class Plant:
    family: str
    rule_id: str
    name: list            # words of the variable name, e.g. ["aws", "access", "key", "id"]
    pieces: list          # [(text, is_secret)]
    needs_name: bool = False
    multiline: bool = False
    kind: str = "value"   # value | url | header | pem | cli | doc
    extra: dict = field(default_factory=dict)

    @property
    def value(self):
        return "".join(t for t, _ in self.pieces)


class Gen:
    """Random strings in the alphabets providers document."""

    def __init__(self, rng):
        self.r = rng

    def s(self, alphabet, n):
        return "".join(self.r.choice(alphabet) for _ in range(n))

    def mixed(self, alphabet, n):
        # Real tokens practically always mix letters and digits; a uniformly random
        # string can, rarely, come out all letters. Draw again in that case.
        while True:
            v = self.s(alphabet, n)
            if n < 12 or (any(c.isdigit() for c in v) and any(c.isalpha() for c in v)):
                return v

    def uuid4(self):
        h = self.s(HEX, 32)
        h = h[:12] + "4" + h[13:16] + self.r.choice("89ab") + h[17:]
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def bytes_(self, n):
        return bytes(self.r.getrandbits(8) for _ in range(n))

    def b64(self, n_bytes, url=False):
        raw = self.bytes_(n_bytes)
        out = base64.urlsafe_b64encode(raw) if url else base64.b64encode(raw)
        return out.decode()

    def password(self, n=None, url_safe=False):
        n = n or self.r.randint(12, 22)
        symbols = "-_.~" if url_safe else "!%^&*-_+=.~@"
        alphabet = ALNUM * 3 + symbols
        while True:
            v = self.s(alphabet, n)
            if any(c.isdigit() for c in v) and any(c.isupper() for c in v) and any(c.islower() for c in v):
                return v


def base62(n, width):
    out = ""
    while n:
        n, r = divmod(n, 62)
        out = (string.digits + string.ascii_uppercase + string.ascii_lowercase)[r] + out
    return out.rjust(width, "0")


def checksummed(g, prefix, body_len):
    """GitHub / npm style: random base62 body + base62(CRC32(body)) padded to 6."""
    body = g.mixed(ALNUM, body_len)
    return prefix + body + base62(zlib.crc32(body.encode()) & 0xFFFFFFFF, 6)


def jwt(g, alg="HS256", sig_bytes=32):
    def enc(obj):
        return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")
    header = enc({"alg": alg, "typ": "JWT"})
    payload = enc({"sub": g.uuid4(), "iss": g.r.choice(["auth.internal", "idp.corp", "accounts.svc"]),
                   "iat": 1700000000 + g.r.randint(0, 9 ** 7), "exp": 1800000000 + g.r.randint(0, 9 ** 7),
                   "scope": g.r.choice(["read", "read write", "admin", "orders:write"])})
    sig = base64.urlsafe_b64encode(g.bytes_(sig_bytes)).decode().rstrip("=")
    return f"{header}.{payload}.{sig}"


def pem_body(g, der_prefix, n_bytes):
    raw = der_prefix + g.bytes_(n_bytes)
    b = base64.b64encode(raw).decode()
    return "\n".join(b[i:i + 64] for i in range(0, len(b), 64))


PEM_KINDS = {
    # rule id: (armour label, DER/binary prefix whose base64 real keys start with)
    "rsa-private-key": ("RSA PRIVATE KEY", bytes.fromhex("308204a40201000282010100")),
    "ec-private-key": ("EC PRIVATE KEY", bytes.fromhex("30770201010420")),
    "pkcs8-private-key": ("PRIVATE KEY", bytes.fromhex("308204bd020100300d06092a864886f70d0101010500048204a7")),
    "pkcs8-encrypted-private-key": ("ENCRYPTED PRIVATE KEY", bytes.fromhex("3082051c304e06092a864886f70d01050d3041")),
    "openssh-private-key": ("OPENSSH PRIVATE KEY", b"openssh-key-v1\x00\x00\x00\x00\x04none"),
    "dsa-private-key": ("DSA PRIVATE KEY", bytes.fromhex("308201bb02010002818100")),
    "pgp-private-key-block": ("PGP PRIVATE KEY BLOCK", bytes.fromhex("9501d80465")),
}


def pem(g, rule_id):
    label, prefix = PEM_KINDS[rule_id]
    body = pem_body(g, prefix, g.r.randint(90, 400))
    extra = "\n" if label.startswith("PGP") else ""
    text = f"-----BEGIN {label}-----\n{extra}{body}\n-----END {label}-----"
    return Plant("private-keys", rule_id, ["private", "key"], [(text, True)], multiline=True, kind="pem")
