"""The fidelity evaluation's prompts: real text that ships in Debian, in three workloads.

Each prompt is a prefix (the KV a worker caches: what the policies compress) and a
continuation of --continuation tokens that is teacher-forced on every cache:

* chat: an instruction in the model's chat template (its default system prompt, one user turn)
  asking about Debian packages, with their descriptions from dpkg's status file quoted in the
  turn. The continuation is the model's own greedy answer with full-precision KV.
* code: source files (CPython's standard library, C headers of libc and of the daemon's
  dependencies). The prefix is the file's first --prefix tokens, the continuation the file's
  next tokens.
* summarization: a long document (the licences in /usr/share/common-licenses) truncated to
  --prefix tokens inside a chat-template request for a summary. The continuation is the model's
  greedy summary with full-precision KV.

Generated continuations never end early: the end-of-turn and end-of-text tokens are suppressed
while generating, so every prompt scores the same number of tokens. Every source is a file a
Debian 12 machine set up by deploy/setup-debian.sh has; a missing one is an error naming it.
"""

import os
import re
from dataclasses import dataclass

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# (package, question) for chat; each prompt quotes these packages' dpkg descriptions.
CHAT = [
    (("coreutils", "findutils", "grep"),
     "I need to find every log file over 10 MB under /var and count the lines that mention "
     "errors. Which of these packages do I need, and how would I combine them?"),
    (("tar", "gzip", "xz-utils"),
     "Explain the difference between these tools and when I should use each one for backups."),
    (("sed", "mawk", "diffutils"),
     "I have two versions of a configuration file. Walk me through comparing them and "
     "rewriting a setting in place."),
    (("bash", "dash", "util-linux"),
     "Why does Debian have two shells installed, and what else from util-linux is useful in "
     "shell scripts?"),
    (("cmake", "make", "ninja-build"),
     "Compare these build tools and recommend one for a new C++ project, with reasons."),
    (("redis-server", "prometheus", "zstd"),
     "How could these three fit together in a service that caches compressed data and is "
     "monitored? Describe an architecture."),
]

CODE = [
    "/usr/lib/python3.11/textwrap.py",
    "/usr/lib/python3.11/heapq.py",
    "/usr/lib/python3.11/shlex.py",
    "/usr/include/zstd.h",
    "/usr/include/zlib.h",
    "/usr/include/pthread.h",
]

SUMMARIZATION = [
    "/usr/share/common-licenses/Apache-2.0",
    "/usr/share/common-licenses/GPL-3",
    "/usr/share/common-licenses/LGPL-2.1",
    "/usr/share/common-licenses/MPL-2.0",
    "/usr/share/common-licenses/Artistic",
    "/usr/share/common-licenses/GFDL-1.3",
]

# The held-out set: other packages and questions, source files and licences, fixed before any
# tuning of the rule on it (--prompt-set heldout), to check that what was tuned on the set
# above carries over.
HELDOUT_CHAT = [  # packages deploy/setup-debian.sh installs, or that a Debian base system has
    (("git", "patch", "perl"),
     "Someone mailed me a fix as a diff. How do I review it, apply it, and undo it if it "
     "breaks something?"),
    (("curl", "openssl", "python3"),
     "Why do HTTPS downloads fail in a fresh container, and how would I check a server's "
     "certificate with these tools?"),
    (("apt", "dpkg", "gpgv"),
     "How does Debian make sure that a package I install was not tampered with on the way?"),
    (("gcc", "binutils", "pkg-config"),
     "My C program fails to link against a library I installed. How do these tools help me "
     "find out why?"),
    (("memcached", "redis-tools", "python3-venv"),
     "I need a cache in front of a slow Python service. Compare the options here and say how "
     "I would set up the Python side."),
    (("libc-bin", "ncurses-bin", "passwd"),
     "A new user cannot log in and their terminal shows garbage when they do. Which of these "
     "packages are involved, and what would I check?"),
]

HELDOUT_CODE = [
    "/usr/lib/python3.11/argparse.py",
    "/usr/lib/python3.11/difflib.py",
    "/usr/lib/python3.11/pprint.py",
    "/usr/lib/python3.11/fractions.py",
    "/usr/include/stdio.h",
    "/usr/include/unistd.h",
]

HELDOUT_SUMMARIZATION = [
    "/usr/share/common-licenses/GPL-2",
    "/usr/share/common-licenses/LGPL-3",
    "/usr/share/common-licenses/MPL-1.1",
    "/usr/share/common-licenses/GFDL-1.2",
    "/usr/share/common-licenses/CC0-1.0",
    "/usr/share/common-licenses/GPL-1",
]

WORKLOADS = ("chat", "code", "summarization")
PROMPT_SETS = {
    "main": (CHAT, CODE, SUMMARIZATION),
    "heldout": (HELDOUT_CHAT, HELDOUT_CODE, HELDOUT_SUMMARIZATION),
}


@dataclass
class Prompt:
    workload: str
    name: str     # a short label: the file or the packages
    source: str   # where the text comes from
    prefix: list  # token ids
    continuation: list  # token ids, teacher-forced; filled by the caller for generated ones
    generate: bool  # continuation is the model's greedy output, not text


def _read(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: a source of the evaluation's prompts is missing "
                                "(run deploy/setup-debian.sh)")
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _descriptions(packages):
    status = _read("/var/lib/dpkg/status")
    found = {}
    for stanza in status.split("\n\n"):
        name = re.search(r"^Package: (\S+)$", stanza, re.M)
        desc = re.search(r"^Description: (.*(?:\n .*)*)", stanza, re.M)
        if name and desc and name.group(1) in packages and name.group(1) not in found:
            text = desc.group(1).replace("\n .\n", "\n\n").replace("\n ", "\n")
            found[name.group(1)] = text
    missing = [p for p in packages if p not in found]
    if missing:
        raise FileNotFoundError(f"/var/lib/dpkg/status: no description of {', '.join(missing)} "
                                "(run deploy/setup-debian.sh)")
    return [f"Package {p}: {found[p]}" for p in packages]


def chat_template(user):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


def build(encode, workloads, per_workload, prefix_tokens, continuation_tokens,
          prompt_set="main"):
    """The prompts of `workloads` (names from WORKLOADS), at most `per_workload` each, from
    `prompt_set` (a key of PROMPT_SETS). `encode` maps text to token ids. Generated
    continuations are left empty."""
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {prompt_set!r}; known: {', '.join(PROMPT_SETS)}")
    chat, code, summarization = PROMPT_SETS[prompt_set]
    prompts = []
    for workload in workloads:
        if workload == "chat":
            for packages, question in chat[:per_workload]:
                user = "\n\n".join(_descriptions(packages)) + "\n\n" + question
                prompts.append(Prompt("chat", "+".join(packages), "/var/lib/dpkg/status",
                                      encode(chat_template(user)), [], True))
        elif workload == "code":
            for path in code[:per_workload]:
                ids = encode(_read(path))
                need = prefix_tokens + continuation_tokens
                if len(ids) < need:
                    raise ValueError(f"{path}: {len(ids)} tokens, the code workload needs {need}")
                prompts.append(Prompt("code", os.path.basename(path), path, ids[:prefix_tokens],
                                      ids[prefix_tokens:need], False))
        elif workload == "summarization":
            for path in summarization[:per_workload]:
                head = encode(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
                              "Summarize the following document.\n\n")
                tail = encode("\n\nSummarize the document above in a few paragraphs.<|im_end|>\n"
                              "<|im_start|>assistant\n")
                doc = encode(_read(path))[:max(0, prefix_tokens - len(head) - len(tail))]
                prompts.append(Prompt("summarization", os.path.basename(path), path,
                                      head + doc + tail, [], True))
        else:
            raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    return prompts
