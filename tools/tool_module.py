"""Loads a tool script of this folder that has no .py suffix (bench-peers, bench-ab) as a
module, for its CPU tests."""
import importlib.machinery
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def load_tool(script):
    """The module of tools/`script`, executed once (its main() guard keeps it from running)."""
    name = script.replace("-", "_")
    loader = importlib.machinery.SourceFileLoader(name, os.path.join(HERE, script))
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod
