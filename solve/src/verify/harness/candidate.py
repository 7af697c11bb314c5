# The candidate's side of a judged test (run as `python3 -I -S -c` in its own
# sandbox). It runs the program, tells the test's process what the program
# defined, then serves calls: each request names a function and carries its
# arguments as plain data; each reply carries the return value as plain data.
# It never sees the test or the pass token, and nothing it does decides a
# verdict: the test's process checks every reply strictly and compares there.
import os, sys
def _tern_candidate():
    import json, traceback, types
    requests, replies = 5, 6
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    program = job["program"]
    del job
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    os.closerange(3, requests)
    os.closerange(replies + 1, 1024)
    inbox = os.fdopen(requests, "rb")

    class NotPlain(Exception):
        pass

    def enc(x, depth=0):
        if depth > 100:
            raise NotPlain("data nested deeper than 100 levels")
        t = type(x)
        if x is None or t is bool or t is int or t is float or t is str:
            return x
        d = depth + 1
        if t is list:
            return {"l": [enc(v, d) for v in x]}
        if t is tuple:
            return {"t": [enc(v, d) for v in x]}
        if t is dict:
            return {"d": [[enc(k, d), enc(v, d)] for k, v in x.items()]}
        if t is set:
            return {"s": [enc(v, d) for v in x]}
        if t is frozenset:
            return {"f": [enc(v, d) for v in x]}
        if t is bytes:
            return {"b": x.hex()}
        if t is bytearray:
            return {"B": x.hex()}
        if t is complex:
            return {"c": [x.real, x.imag]}
        raise NotPlain(t.__name__)

    def dec(v):
        if v is None or type(v) in (bool, int, float, str):
            return v
        (tag, body), = v.items()
        if tag == "l":
            return [dec(e) for e in body]
        if tag == "t":
            return tuple(dec(e) for e in body)
        if tag == "d":
            return {dec(k): dec(e) for k, e in body}
        if tag == "s":
            return {dec(e) for e in body}
        if tag == "f":
            return frozenset(dec(e) for e in body)
        if tag == "b":
            return bytes.fromhex(body)
        if tag == "B":
            return bytearray.fromhex(body)
        if tag == "c":
            return complex(body[0], body[1])
        raise ValueError("unknown tag")

    def send(message):
        data = (json.dumps(message) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(replies, view):]

    ns = {"__name__": "candidate"}
    try:
        exec(compile(program, "candidate", "exec", dont_inherit=True), ns)
    except AssertionError as error:
        reason = str(error)
        if not reason:
            lines = program.splitlines()
            at = [f.lineno for f in traceback.extract_tb(error.__traceback__)
                  if f.filename == "candidate"]
            line = lines[at[-1] - 1].strip() if at and at[-1] and at[-1] <= len(lines) else ""
            reason = "assertion failed" + (": " + line if line else "")
        send({"fail": reason})
        return
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        send({"crash": True})
        return
    names = {}
    for name, value in list(ns.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            names[name] = ["m", value.__name__]
        elif isinstance(value, type):
            continue
        elif callable(value):
            names[name] = ["f"]
        else:
            try:
                names[name] = ["v", enc(value)]
            except Exception:
                pass
    alias = None
    if not callable(ns.get("candidate")):
        functions = [k for k, v in ns.items()
                     if getattr(getattr(v, "__code__", None), "co_filename", None) == "candidate"]
        if functions:
            alias = functions[-1]
    send({"names": names, "candidate": alias})
    mutable = (list, dict, set, bytearray)
    for line in inbox:
        request = json.loads(line)
        try:
            args = [dec(a) for a in request["args"]]
            kwargs = {k: dec(v) for k, v in request["kwargs"].items()}
            result = ns[request["call"]](*args, **kwargs)
        except BaseException as error:
            traceback.print_exc()
            sys.stderr.flush()
            send({"raise": [type(error).__name__, str(error)]})
            continue
        try:
            reply = {"ret": enc(result),
                     "args": [enc(a) if type(a) in mutable else None for a in args]}
        except NotPlain as why:
            reply = {"bad": str(why)}
        except BaseException as error:
            reply = {"raise": [type(error).__name__, str(error)]}
        send(reply)
_tern_candidate()
