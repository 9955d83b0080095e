"""Return the arguments unchanged: the byte-exactness probe of the remote primitive."""


def run(args):
    return {"args": args}
