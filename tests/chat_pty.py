"""Drives `wgpu-llm chat` under a pseudo-terminal for tests/chat.rs.

    python3 tests/chat_pty.py BINARY ARGS... < steps.json

Runs BINARY ARGS... as the child of a new pseudo-terminal (its controlling terminal: Ctrl-C typed
there is SIGINT to it, Ctrl-D is the end of input), waits for its first prompt ("> "), then plays
the steps, a JSON list read from stdin, each one of:

    {"line": TEXT}                    types TEXT and Enter, waits for the next prompt
    {"line": TEXT, "interrupt": true} types TEXT and Enter, waits for the first character of the
                                      answer, types Ctrl-C, waits for the next prompt
    {"key": "\\u0003"}                types the key (Ctrl-C, Ctrl-D), waits for the next prompt or
                                      the end of the program

and prints a JSON report: {"banner": output before the first prompt, "steps": [the output that
followed each step], "status": the exit status (null if the program had to be killed), "rest":
output after the last step}. A step that sees neither a prompt nor the end in TIMEOUT seconds ends
the run (the report says "timeout": the step's index).
"""

import json
import os
import pty
import select
import signal
import sys
import time

PROMPT = b"> "
TIMEOUT = 120.0


class Child:
    def __init__(self, argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(argv[0], argv)
        self.out = bytearray()
        self.closed = False

    def read_until(self, done, timeout=TIMEOUT):
        """Reads until done(output) or the terminal closes; false on a timeout."""
        deadline = time.monotonic() + timeout
        while not done(self.out) and not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            try:
                data = os.read(self.fd, 4096)
            except OSError:  # EIO: the child has exited and closed the terminal
                data = b""
            if not data:
                self.closed = True
            self.out.extend(data)
        return True

    def write(self, data):
        os.write(self.fd, data)

    def status(self, timeout=30.0):
        """The exit status, or None after killing a child that does not end."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            self.read_until(lambda _: False, 0.1)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        return None


def prompt_after(mark):
    return lambda out: len(out) > mark and out.endswith(PROMPT)


def answer_started(mark):
    """Output after `mark` holds the echoed line and then a character of the answer."""

    def check(out):
        line_end = out.find(b"\n", mark)
        return line_end >= 0 and out[line_end + 1 :].strip() != b""

    return check


def main():
    steps = json.load(sys.stdin)
    child = Child(sys.argv[1:])
    report = {"steps": [], "status": None}
    ok = child.read_until(prompt_after(0))
    report["banner"] = child.out.decode(errors="replace")
    if not ok:
        report["timeout"] = -1
    for i, step in enumerate(steps if ok else []):
        mark = len(child.out)
        if "line" in step:
            child.write(step["line"].encode() + b"\r")
            if step.get("interrupt"):
                if not child.read_until(answer_started(mark)):
                    report["timeout"] = i
                    break
                child.write(b"\x03")
        else:
            child.write(step["key"].encode())
        ok = child.read_until(prompt_after(len(child.out)))
        report["steps"].append(child.out[mark:].decode(errors="replace"))
        if not ok:
            report["timeout"] = i
            break
        if child.closed:
            break
    mark = len(child.out)
    report["status"] = child.status()
    report["rest"] = child.out[mark:].decode(errors="replace")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
