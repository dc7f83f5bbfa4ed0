#!/usr/bin/env python3
"""Deterministic labelled corpus for the crossguard firewall (Python 3 stdlib only).

    python3 scripts/corpus/make_corpus.py [--seed 20260130] [--out firewall/tests/corpus]

writes one JSON Lines file per document kind (answers, code, configs, logs, prose). Each
record is

    {"id": "code-0007", "kind": "code", "text": "...",
     "secrets": [{"rule_family": "code-hosting", "rule_id": "github-pat-classic", "start": 120, "end": 160}]}

with `start`/`end` as UTF-8 byte offsets into `text` (the documents mix English and
Russian, so byte and character offsets differ). `rule_id` is the rule we expect to catch
the secret; the evaluation only needs the span. Secrets come from catalogue.py (built from
provider format descriptions, never from the rules' regexes); hard negatives and filler
from text.py. The same seed always produces byte-identical files.
"""
import argparse
import json
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from catalogue import pick  # noqa: E402
from formats import Gen  # noqa: E402
from text import EN_OPEN, RU_OPEN, hard_negative, identifier, paragraph, sentence  # noqa: E402


class Doc:
    """Text under construction plus the byte spans of the secrets planted in it."""

    def __init__(self):
        self.parts, self.n, self.secrets = [], 0, []

    def add(self, s):
        self.parts.append(s)
        self.n += len(s.encode())

    def plant(self, p, esc=lambda s: s):
        for text, secret in p.pieces:
            start = self.n
            self.add(esc(text))
            if secret:
                self.secrets.append({"rule_family": p.family, "rule_id": p.rule_id, "start": start, "end": self.n})

    def text(self):
        return "".join(self.parts)


def style(words, how):
    if how == "upper":
        return "_".join(w.upper() for w in words)
    if how == "snake":
        return "_".join(words)
    return words[0] + "".join(w.capitalize() for w in words[1:])


def json_esc(s):
    return json.dumps(s, ensure_ascii=False)[1:-1]


def write_special(d, p, lang):
    """Plants whose shape dictates the line: headers, command lines, hashes, key files."""
    k = p.kind
    if k == "header":
        tpl = {"python": ('headers = {"Authorization": "Bearer ', '"}'), "js": ("  headers: { Authorization: `Bearer ", "` },"),
               "shell": ('curl -sS -H "Authorization: Bearer ', '" https://api.internal/v1/orders')}.get(lang, ("Authorization: Bearer ", ""))
    elif k == "basic":
        tpl = ("Authorization: Basic ", "")
    elif k == "xapikey":
        tpl = ('curl -H "X-API-Key: ', '" https://api.internal/v2/reports') if lang == "shell" else ("X-API-Key: ", "")
    elif k == "cli":
        tpl = d_choice(d, [("mysql -h db.internal -u admin -p", " shop"), ("psql --password=", " -h db.internal"),
                           ("sshpass -p '", "' ssh root@10.0.0.12"), ("docker login --password ", " registry.internal")])
    elif k == "hash":
        tpl = (d_choice(d, ["admin:", "deploy:", "root:"]), "")
    elif k == "wireguard":
        tpl = ("[Interface]\nAddress = 10.8.0.2/24\nPrivateKey = ", "\nDNS = 10.8.0.1")
    elif k == "kubeconfig":
        tpl = ("users:\n- name: admin\n  user:\n    client-certificate-data: LS0tLS1CRUdJTiBDRVJU\n    client-key-data: ", "")
    else:
        return False
    d.add(tpl[0])
    d.plant(p)
    d.add(tpl[1] + "\n")
    return True


def d_choice(d, xs):
    return xs[d.rng.randrange(len(xs))]


def write_plant(d, p, lang):
    """One plant as a line of `lang`: env, yaml, json, toml, ini, python, js, go, shell."""
    if write_special(d, p, lang):
        return
    if p.multiline:
        if lang == "json":
            d.add('  "private_key": "'), d.plant(p, json_esc), d.add('\\n",\n')
        elif lang == "yaml":
            d.add("tls_key: |\n  ")
            d.plant(p, lambda s: s.replace("\n", "\n  "))
            d.add("\n")
        elif lang == "python":
            d.add('PRIVATE_KEY = """'), d.plant(p), d.add('\n"""\n')
        else:
            d.plant(p), d.add("\n")
        return
    quoted = d.rng.random() < 0.6
    if p.rule_id.startswith("generic-password"):
        p.rule_id = "generic-password-quoted" if quoted or lang in ("json", "python", "js", "go", "toml") else "generic-password-unquoted"
    q = '"' if quoted else ""
    if lang == "env":
        d.add(f"{style(p.name, 'upper')}={q}"), d.plant(p), d.add(f"{q}\n")
    elif lang == "shell":
        d.add(f'export {style(p.name, "upper")}="'), d.plant(p), d.add('"\n')
    elif lang == "yaml":
        d.add(f"  {style(p.name, 'snake')}: {q}"), d.plant(p), d.add(f"{q}\n")
    elif lang == "json":
        d.add(f'  "{style(p.name, d_choice(d, ["camel", "snake"]))}": "'), d.plant(p, json_esc), d.add('",\n')
    elif lang in ("toml", "ini"):
        qq = '"' if lang == "toml" else q
        d.add(f"{style(p.name, 'snake')} = {qq}"), d.plant(p), d.add(f"{qq}\n")
    elif lang == "python":
        d.add(f'{style(p.name, d_choice(d, ["upper", "snake"]))} = "'), d.plant(p), d.add('"\n')
    elif lang == "js":
        d.add(f"const {style(p.name, 'camel')} = '"), d.plant(p), d.add("';\n")
    elif lang == "go":
        d.add(f'\t{style(p.name, "camel")} := "'), d.plant(p), d.add('"\n')
    else:
        d.add(f"{style(p.name, 'upper')}="), d.plant(p), d.add("\n")


def write_inline(d, p, ru):
    """A plant inside prose; only for secrets recognisable without a variable name."""
    en = ["I pasted {} into the config and it still fails.", "The token {} was in the log output.", "Use {} for now and rotate it later.",
          "Here is the value: {}", "Got this back from the API: {} - is that expected?"]
    rus = ["Я вставил {} в конфиг, но всё равно ошибка.", "Токен {} попал в журнал.", "Пока используйте {}, потом замените.",
           "Вот значение: {}", "API вернул {} — это нормально?"]
    a, b = d_choice(d, rus if ru else en).split("{}")
    d.add(a), d.plant(p), d.add(b)


LANGS = ["env", "yaml", "json", "toml", "ini", "python", "js", "go", "shell"]
FENCE = {"env": "bash", "shell": "bash", "js": "javascript", "ini": "ini", "toml": "toml", "yaml": "yaml", "json": "json", "python": "python", "go": "go"}


def config_block(d, g, lang, n_secrets, n_neg):
    """Lines of one config/code block: plants and hard negatives shuffled with filler."""
    items = [("s", None)] * n_secrets + [("n", None)] * n_neg + [("f", None)] * g.r.randint(1, 5)
    g.r.shuffle(items)
    if lang == "json":
        d.add("{\n")
    for kind, _ in items:
        if kind == "s":
            write_plant(d, pick(g), lang)
        elif kind == "n":
            d.add(hard_negative(g) + "\n")
        else:
            d.add(filler_line(g, lang) + "\n")
    if lang == "json":
        d.add('  "version": 3\n}\n')


def filler_line(g, lang):
    ident = identifier(g)
    return {"env": f"{ident.upper()}={g.r.randint(1, 9000)}", "yaml": f"  {ident.lower()}: {g.r.choice(['true', 'false', 'info', 42])}",
            "json": f'  "{ident}": {g.r.randint(0, 999)},', "python": f"{ident.lower()} = {ident}()",
            "js": f"const {ident} = require('./{ident.lower()}');", "go": f"\t{ident} := {ident.lower()}.New()",
            "shell": f"echo \"{sentence(g)}\"", "toml": f"{ident.lower()} = {g.r.randint(0, 99)}", "ini": f"{ident.lower()}={ident}"}[lang]


def doc_answer(d, g, ru):
    d.add(g.r.choice(RU_OPEN if ru else EN_OPEN) + " " + paragraph(g, ru) + "\n\n")
    for _ in range(g.r.randint(1, 2)):
        lang = g.r.choice(LANGS)
        d.add(f"```{FENCE[lang]}\n")
        config_block(d, g, lang, g.r.choice([0, 0, 1, 1, 2]), g.r.randint(1, 3))
        d.add("```\n\n" + paragraph(g, ru) + "\n\n")


def doc_code(d, g):
    lang = g.r.choice(["python", "js", "go", "shell"])
    header = {"python": "import os\nimport requests\n\n", "js": "'use strict';\nconst axios = require('axios');\n\n",
              "go": "package main\n\nimport \"net/http\"\n\nfunc main() {\n", "shell": "#!/usr/bin/env bash\nset -euo pipefail\n\n"}[lang]
    d.add(header)
    for _ in range(g.r.randint(2, 4)):
        d.add({"python": "# ", "js": "// ", "go": "\t// ", "shell": "# "}[lang] + sentence(g) + "\n")
        config_block(d, g, lang, g.r.choice([0, 0, 1, 1, 2]), g.r.randint(1, 3))
    if lang == "go":
        d.add("}\n")


def doc_config(d, g):
    lang = g.r.choice(["env", "yaml", "json", "toml", "ini"])
    if lang == "yaml":
        d.add(f"# {sentence(g)}\n{identifier(g).lower()}:\n")
    if lang == "ini":
        d.add(f"[{identifier(g).lower()}]\n")
    config_block(d, g, lang, g.r.choice([0, 1, 1, 2, 3]), g.r.randint(2, 5))


def doc_log(d, g):
    for i in range(g.r.randint(15, 45)):
        ts = f"2026-01-{g.r.randint(10, 28)}T{g.r.randint(10, 23)}:{g.r.randint(10, 59)}:{g.r.randint(10, 59)}.{g.r.randint(100, 999)}Z"
        lvl = g.r.choice(["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"])
        d.add(f"{ts} {lvl} [{identifier(g)}] ")
        x = g.r.random()
        if x < 0.06:
            p = pick(g)
            if p.kind in ("value", "url") and not p.multiline and not p.needs_name:
                d.add("outgoing request with credential "), d.plant(p), d.add("\n")
            else:
                write_plant(d, p, "env")
        elif x < 0.25:
            d.add(hard_negative(g).replace("\n", " ") + "\n")
        else:
            d.add(f"{sentence(g)} latency_ms={g.r.randint(1, 900)} request_id={g.uuid4()}\n")


def doc_prose(d, g, ru):
    for _ in range(g.r.randint(2, 5)):
        d.add(paragraph(g, ru) + " ")
        if g.r.random() < 0.3:
            p = pick(g)
            if p.kind == "value" and not p.needs_name and not p.multiline:
                write_inline(d, p, ru)
            elif g.r.random() < 0.5:
                d.add(hard_negative(g).replace("\n", " "))
        d.add("\n\n")


KINDS = {"answers": 260, "code": 160, "configs": 220, "logs": 60, "prose": 190}


def build(seed):
    out = {}
    for kind, n in KINDS.items():
        recs = []
        for i in range(n):
            g = Gen(random.Random(f"{seed}/{kind}/{i}"))
            d = Doc()
            d.rng = g.r
            ru = g.r.random() < 0.35
            {"answers": lambda: doc_answer(d, g, ru), "code": lambda: doc_code(d, g), "configs": lambda: doc_config(d, g),
             "logs": lambda: doc_log(d, g), "prose": lambda: doc_prose(d, g, ru)}[kind]()
            recs.append({"id": f"{kind}-{i:04d}", "kind": kind, "text": d.text(), "secrets": d.secrets})
        out[kind] = recs
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", default="20260130")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parents[2] / "firewall" / "tests" / "corpus"))
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    total, secrets = 0, 0
    for kind, recs in build(a.seed).items():
        lines = [json.dumps(r, ensure_ascii=False, sort_keys=True) for r in recs]
        data = ("\n".join(lines) + "\n").encode()
        (out / f"{kind}.jsonl").write_bytes(data)
        total += len(data)
        secrets += sum(len(r["secrets"]) for r in recs)
    print(f"wrote {out}: {total} bytes, {sum(KINDS.values())} records, {secrets} planted secrets")


if __name__ == "__main__":
    main()
