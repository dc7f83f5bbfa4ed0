#!/usr/bin/env python3
"""Turn peer secret scanners' public test samples into labelled JSONL records.

The samples are used as data (texts and the findings their authors expect), never as
code: this script reads each peer's repository with `git show` and writes

    {"id": "...", "text": "...", "secrets": [{"kind": "...", "start": N, "end": N, "value": "..."}],
     "source": {"repo": "...", "path": "...", "commit": "...", "licence": "..."}}

one per line. A record with no secrets is a clean text (a hard negative). A secret without
`start`/`end` says "this text holds a credential of this kind" without a position (the
peer's test asserts only that its rule fires); the evaluation then accepts any finding in
the text for it.

Records are split by a hash of their text, so the split never changes when sources are
added: firewall/tests/peers/tuning.jsonl and held-back.jsonl (about half each).

    python3 scripts/corpus/peers/extract.py \
        --credsweeper /work/.mirror/Samsung+CredSweeper/repo \
        --noseyparker /work/.mirror/praetorian-inc+noseyparker/repo \
        --gitleaks /work/.mirror/gitleaks+gitleaks/repo \
        --kingfisher /work/.mirror/mongodb+kingfisher/repo \
        --secretlint /work/.mirror/secretlint+secretlint/repo \
        --ripsecrets /work/.mirror/sirwart+ripsecrets/repo --out firewall/tests/peers

Sources are read in that order and a text already taken is not taken again (Kingfisher's
rules began as Nosey Parker's, examples included), so adding a source never moves or
relabels a record of an earlier one.
"""

import argparse
import hashlib
import json
import pathlib
import re
import subprocess
import sys

# Only permissively licensed peers: their samples may be committed as data.
LICENCES = {
    "Samsung/CredSweeper": "MIT",
    "praetorian-inc/noseyparker": "Apache-2.0",
    "gitleaks/gitleaks": "MIT",
    "mongodb/kingfisher": "Apache-2.0",
    "secretlint/secretlint": "MIT",
    "sirwart/ripsecrets": "MIT",
}

# CredSweeper rules whose findings are not credentials (identifiers, hosts, salts).
CREDSWEEPER_NOT_SECRETS = {
    "UUID", "AWS S3 Bucket", "Firebase Domain", "Tencent WeChat API App ID", "Nonce", "Salt",
}

# CredSweeper's samples that are not text (archives, office files, key stores, images).
BINARY_SUFFIXES = (
    ".zip", ".gz", ".bz2", ".xz", ".tar", ".7z", ".jks", ".class", ".docx", ".xlsx", ".pptx",
    ".pdf", ".png", ".jpg", ".p12", ".pfx", ".eml", ".lzma", ".rpm", ".deb", ".apk", ".jar",
    ".mp3", ".wav", ".odt", ".ods", ".sqlite", ".der", ".bin",
)


class Repo:
    """A bare git directory read at one commit."""

    def __init__(self, git_dir, name):
        self.git_dir = str(git_dir)
        self.name = name
        self.commit = self._git("rev-parse", "HEAD").decode().strip()

    def _git(self, *args):
        return subprocess.run(["git", "--git-dir", self.git_dir, *args], check=True,
                              capture_output=True).stdout

    def files(self, under):
        out = self._git("ls-tree", "-r", "--name-only", self.commit, under).decode()
        return [p for p in out.splitlines() if p]

    def read(self, path):
        return self._git("show", f"{self.commit}:{path}")

    def source(self, path):
        return {"repo": self.name, "path": path, "commit": self.commit,
                "licence": LICENCES[self.name]}


def as_text(raw):
    """The file as text, or None for binary content."""
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


# --- CredSweeper: sample files plus the findings its regression test expects ---------------

def credsweeper(repo):
    expected = json.loads(repo.read("tests/data/output.json"))
    # One expected credential can span several lines (a PEM key, a login and its
    # password): CredSweeper lists one line entry per line, the credential is one secret.
    by_path = {}
    for cred in expected:
        if cred["rule"] in CREDSWEEPER_NOT_SECRETS:
            continue
        lines = {}
        for line in cred["line_data_list"]:
            lines.setdefault(line["path"].removeprefix("./"), []).append(line)
        for path, group in lines.items():
            by_path.setdefault(path, []).append((cred["rule"], group))
    for path in repo.files("tests/samples"):
        if path.lower().endswith(BINARY_SUFFIXES):
            continue
        text = as_text(repo.read(path))
        if text is None or not text.strip():
            continue
        secrets = []
        for kind, group in by_path.get(path, []):
            spans = [locate(text, line) for line in group]
            if None in spans:
                print(f"credsweeper: {path}:{group[0]['line_num']}: value not found, skipped", file=sys.stderr)
                continue
            start, end = min(a for a, _ in spans), max(b for _, b in spans)
            secrets.append({"kind": kind, "start": start, "end": end,
                            "value": text.encode()[start:end].decode(errors="replace")})
        yield {"id": f"credsweeper:{path}", "text": text, "secrets": dedup(secrets),
               "source": repo.source(path)}


def locate(text, line):
    """Byte span of a CredSweeper finding (its value on its line) in the file's text."""
    value = line["value"]
    lines = text.splitlines(keepends=True)
    n = line["line_num"] - 1
    if 0 <= n < len(lines):
        offset = sum(len(x) for x in lines[:n])
        at = lines[n].find(line["line"])
        if at >= 0:
            start = offset + at + line["value_start"]
            if text[start:start + len(value)] == value:
                return byte_span(text, start, start + len(value))
        at = lines[n].find(value)
        if at >= 0:
            return byte_span(text, offset + at, offset + at + len(value))
    at = text.find(value)
    return None if at < 0 else byte_span(text, at, at + len(value))


def byte_span(text, start, end):
    """Character offsets to UTF-8 byte offsets (`crossguard scan` reports bytes)."""
    b = len(text[:start].encode())
    return b, b + len(text[start:end].encode())


def dedup(secrets):
    seen, out = set(), []
    for s in secrets:
        key = (s.get("start"), s.get("end"), s.get("value"))
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


# --- Nosey Parker: each rule's examples and negative examples -------------------------------

def noseyparker(repo):
    # Identifiers (public keys, client ids, host names) are not secrets.
    yield from rule_examples(repo, "noseyparker", "crates/noseyparker/data/default/builtin/rules",
                             lambda rule: "secret" in (rule.get("categories") or []))


def rule_examples(repo, source, folder, is_secret):
    """Records from YAML rule files with `examples` and `negative_examples` (Nosey Parker's
    format, which Kingfisher kept): an example of a rule `is_secret` holds one secret of
    its kind, a negative example is a clean text."""
    import yaml  # PyYAML: only the YAML sources need it

    for path in repo.files(folder):
        if not path.endswith((".yml", ".yaml")):
            continue
        doc = yaml.safe_load(repo.read(path)) or {}
        for rule in doc.get("rules", []):
            secret = is_secret(rule)
            for i, example in enumerate(rule.get("examples") or []):
                if secret and isinstance(example, str) and example.strip():
                    yield {"id": f"{source}:{rule['id']}:example:{i}", "text": example,
                           "secrets": [{"kind": rule["id"]}], "source": repo.source(path)}
            for i, example in enumerate(rule.get("negative_examples") or []):
                if isinstance(example, str) and example.strip():
                    yield {"id": f"{source}:{rule['id']}:negative:{i}", "text": example,
                           "secrets": [], "source": repo.source(path)}


# --- gitleaks: literal true and false positives in its rule definitions --------------------
# Its samples live in Go source as string literals assigned to `tps` and `fps`; most are
# generated at test time from the rule's regex and cannot be read, but the literal ones are
# real-world shapes its authors collected. Only literals (and `var x = []string{...}` lists
# they name) are taken; anything built by a function call is skipped.

TOKEN = re.compile(r'`[^`]*`|"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/|[A-Za-z_][A-Za-z0-9_.]*|\.\.\.|\S',
                   re.S)
GO_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'"}


def go_string(tok):
    if tok.startswith("`"):
        return tok[1:-1]
    body = tok[1:-1]
    return re.sub(r'\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)',
                  lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] in "xu" and len(m.group(1)) > 1
                  else GO_ESCAPES.get(m.group(1), m.group(1)), body)


def tokens(src):
    return [t for t in TOKEN.findall(src) if not t.startswith(("//", "/*"))]


def expression(toks, i):
    """Tokens of the expression starting at toks[i], up to the end of its statement."""
    depth, j = 0, i
    while j < len(toks):
        t = toks[j]
        if t in "([{":
            depth += 1
        elif t in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and j > i and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", t) \
                and re.fullmatch(r'[)\]}`"]|.*[`"]|[A-Za-z0-9_]+', toks[j - 1]) \
                and not toks[j - 1] in ("+", ",", "(", "{"):
            break  # a new statement began (Go needs no semicolons)
        j += 1
    return toks[i:j]


def strings_of(expr, lists):
    """Literal strings of an expression: list literals, append arguments, named lists.
    Anything inside another call is generated at test time and skipped."""
    out, stack, k = [], [], 0
    while k < len(expr):
        t = expr[k]
        if t == "(":
            stack.append(expr[k - 1] if k else "")
        elif t == "{":
            stack.append("{")
        elif t in ")}":
            if stack:
                stack.pop()
        elif t[0] in '`"' and all(s in ("append", "{") for s in stack) \
                and not (k and expr[k - 1] == "+"):
            s = go_string(t)
            while k + 2 < len(expr) and expr[k + 1] == "+" and expr[k + 2][0] in '`"':
                s += go_string(expr[k + 2])
                k += 2
            if not (k + 1 < len(expr) and expr[k + 1] == "+"):
                out.append(s)
        elif t in lists and all(s in ("append", "{") for s in stack):
            out.extend(lists[t])
        k += 1
    return out


def gitleaks_file(src):
    """{rule id: (tps, fps)} of one rule file."""
    toks = tokens(src)
    lists = {}
    for k in range(len(toks) - 3):
        if toks[k] == "var" and toks[k + 2] == "=" and toks[k + 3] == "[":
            lists[toks[k + 1]] = strings_of(expression(toks, k + 3), {})
    rules, rule = {}, None
    for k, t in enumerate(toks):
        if t == "RuleID" and toks[k + 1] == ":" and toks[k + 2][0] == '"':
            rule = go_string(toks[k + 2])
            rules.setdefault(rule, ([], []))
        elif rule and t in ("tps", "fps") and k + 2 < len(toks) and toks[k + 1] in (":", "=") \
                and (toks[k + 1] == "=" or toks[k + 2] == "="):
            start = k + 2 if toks[k + 1] == "=" else k + 3
            rules[rule][0 if t == "tps" else 1].extend(strings_of(expression(toks, start), lists))
    return rules


def gitleaks(repo):
    found = {}
    for path in repo.files("cmd/generate/config/rules"):
        if path.endswith(".go") and not path.endswith("_test.go"):
            for rule, (tps, fps) in gitleaks_file(repo.read(path).decode()).items():
                found[rule] = (tps, fps, path)
    every_tp = {tp for tps, _, _ in found.values() for tp in tps}
    for rule, (tps, fps, path) in sorted(found.items()):
        for i, tp in enumerate(dict.fromkeys(tps)):
            if tp.strip():
                yield {"id": f"gitleaks:{rule}:tp:{i}", "text": tp,
                       "secrets": [{"kind": rule}], "source": repo.source(path)}
        # One rule's false positive is often another rule's true positive (a Cloudflare
        # API key is a non-match for the global-key rule): those are not clean texts.
        for i, fp in enumerate(dict.fromkeys(fps)):
            if fp.strip() and fp not in every_tp:
                yield {"id": f"gitleaks:{rule}:fp:{i}", "text": fp, "secrets": [],
                       "source": repo.source(path)}


# --- Kingfisher: each rule's examples and negative examples, like Nosey Parker -------------
# Kingfisher marks few rules with categories, so identifiers are told by the rule: hidden
# rules (`visible: false`, the ids and hosts other rules depend on), the `identifier`
# category, and names that say they are an id, a user, a host or a public key.

KINGFISHER_IDENTIFIER = re.compile(
    r"\b(ID|Identifier|Username|User|Domain|Host|Email|Org Name|Account Name|Instance URL|"
    r"JFrog URL|Search URL|Public Key)$|\bRecipient\b|public key", re.I)


def kingfisher(repo):
    yield from rule_examples(repo, "kingfisher", "data/rules", lambda rule:
                             rule.get("visible", True) is not False
                             and "identifier" not in (rule.get("categories") or [])
                             and not KINGFISHER_IDENTIFIER.search(rule.get("name", "").strip()))


# --- secretlint: each rule's snapshot tests (an input and the findings it must give) -------
# Snapshots with their own `.secretlintrc.json` run the rule with changed options, and some
# rules are about paths or comments rather than secrets: both are skipped. A snapshot's
# findings carry UTF-16 ranges into the input (JavaScript strings).

SECRETLINT_SKIPPED_RULES = {
    "secretlint-rule-preset-recommend", "secretlint-rule-preset-canary",  # copies of the rules'
    "secretlint-rule-pattern", "secretlint-rule-filter-comments", "secretlint-rule-example",
    "secretlint-rule-no-homedir", "secretlint-rule-no-dotenv",
}
SECRETLINT_NOT_SECRETS = {"AWSAccountID", "AWSAccessKeyID", "AzureADTenantID", "AzureClientID"}


def secretlint(repo):
    snapshots = {}
    for path in repo.files("packages/@secretlint"):
        m = re.fullmatch(r"packages/@secretlint/(secretlint-rule-[^/]+)/test/snapshots/([^/]+)/(.+)", path)
        if m and m.group(1) not in SECRETLINT_SKIPPED_RULES:
            snapshots.setdefault((m.group(1), m.group(2)), set()).add(m.group(3))
    for (rule, case), names in sorted(snapshots.items()):
        if ".secretlintrc.json" in names or "output.json" not in names:
            continue
        base = f"packages/@secretlint/{rule}/test/snapshots/{case}"
        output = json.loads(repo.read(f"{base}/output.json"))
        text = output.get("sourceContent")
        if not isinstance(text, str) or not text.strip() or "\0" in text:
            continue  # binary inputs (PKCS#12 files) have no text content
        secrets = []
        for message in output.get("messages", []):
            if message.get("messageId") in SECRETLINT_NOT_SECRETS:
                continue
            start, end = (utf16_to_byte(text, x) for x in message["range"])
            secrets.append({"kind": f"{rule.removeprefix('secretlint-rule-')}:{message.get('messageId')}",
                            "start": start, "end": end,
                            "value": text.encode()[start:end].decode(errors="replace")})
        if not secrets and any(m.get("messageId") in SECRETLINT_NOT_SECRETS
                               for m in output.get("messages", [])):
            continue  # an identifier's test: neither a secret nor a clean text
        yield {"id": f"secretlint:{rule}:{case}", "text": text, "secrets": dedup(secrets),
               "source": repo.source(f"{base}/output.json")}


def utf16_to_byte(text, offset):
    """A JavaScript string offset (UTF-16 code units) as a UTF-8 byte offset."""
    prefix = text.encode("utf-16-le")[:2 * offset].decode("utf-16-le", errors="ignore")
    return len(prefix.encode())


# --- ripsecrets: files of one secret per line or per file, and a file with none ------------
# Lines of the clean file that its own ignore list or an allowlist pragma exempts hold
# secrets it chose to ignore: they are neither secrets nor clean texts here.

def ripsecrets(repo):
    ignored = [line.strip() for line in repo.read(".secretsignore").decode().splitlines()
               if line.strip() and not line.startswith("[")]
    for path in repo.files("test/one_per_line"):
        for i, line in enumerate(repo.read(path).decode().splitlines()):
            if line.strip():
                yield {"id": f"ripsecrets:{path}:{i + 1}", "text": line,
                       "secrets": [{"kind": path.rsplit("/", 1)[1]}], "source": repo.source(path)}
    for path in repo.files("test/one_per_file"):
        yield {"id": f"ripsecrets:{path}", "text": repo.read(path).decode(),
               "secrets": [{"kind": path.rsplit("/", 1)[1]}], "source": repo.source(path)}
    for i, line in enumerate(repo.read("test/none").decode().splitlines()):
        if line.strip() and "allowlist secret" not in line and not any(x in line for x in ignored):
            yield {"id": f"ripsecrets:test/none:{i + 1}", "text": line, "secrets": [],
                   "source": repo.source("test/none")}


# --- split --------------------------------------------------------------------------------

def split_of(record):
    """`tuning` or `held-back`, from a hash of the text alone: stable and unbiased."""
    digest = hashlib.sha256(record["text"].encode()).digest()
    return "tuning" if digest[0] % 2 == 0 else "held-back"


# Read in this order: a text already taken is not taken again, so a source added later
# never moves or relabels a record of an earlier one.
SOURCES = [
    ("credsweeper", "Samsung/CredSweeper", credsweeper),
    ("noseyparker", "praetorian-inc/noseyparker", noseyparker),
    ("gitleaks", "gitleaks/gitleaks", gitleaks),
    ("kingfisher", "mongodb/kingfisher", kingfisher),
    ("secretlint", "secretlint/secretlint", secretlint),
    ("ripsecrets", "sirwart/ripsecrets", ripsecrets),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, _, _ in SOURCES:
        ap.add_argument(f"--{flag}", type=pathlib.Path)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("firewall/tests/peers"))
    a = ap.parse_args()
    records = []
    for flag, name, extract in SOURCES:
        if getattr(a, flag):
            records += extract(Repo(getattr(a, flag), name))
    seen, splits = set(), {"tuning": [], "held-back": []}
    for r in records:
        if r["text"] in seen:  # the same text twice would sit in one split only anyway
            continue
        seen.add(r["text"])
        splits[split_of(r)].append(r)
    a.out.mkdir(parents=True, exist_ok=True)
    for name, recs in splits.items():
        with open(a.out / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
        n_secrets = sum(len(r["secrets"]) for r in recs)
        clean = sum(1 for r in recs if not r["secrets"])
        print(f"{name}: {len(recs)} records, {n_secrets} secrets, {clean} clean texts", file=sys.stderr)


if __name__ == "__main__":
    main()
