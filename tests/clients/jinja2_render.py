"""Renders a chat template with Jinja2 as transformers' apply_chat_template does (an immutable
sandbox with trim_blocks, lstrip_blocks and loopcontrols; transformers' tojson, raise_exception
and strftime_now), for the tests that compare tmx's renderer with it.
Usage: python3 jinja2_render.py INPUT_JSON
INPUT_JSON holds {"template": "...", "cases": [{variables}, ...]}; prints one JSON array with,
per case, {"ok": "rendered text"} or {"error": "message"} (raise_exception's message as is).
"""
import json
import sys
from datetime import datetime

import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

with open(sys.argv[1], encoding="utf-8") as f:
    data = json.load(f)
template = env.from_string(data["template"])
out = []
for variables in data["cases"]:
    try:
        out.append({"ok": template.render(**variables)})
    except Exception as e:  # any failure: the test compares with tmx's
        out.append({"error": str(e)})
sys.stdout.write(json.dumps(out) + "\n")
