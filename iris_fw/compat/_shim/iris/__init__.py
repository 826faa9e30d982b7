# Put first on PYTHONPATH by iris_fw.compat.run.install(): a process started by a program that
# runs with the Iris mapping resolves `import iris` here, installs the mapping and becomes
# iris_fw.compat.iris (sys.modules["iris"] is replaced, so `import iris` returns that module).
import sys

from iris_fw.compat.run import TARGET, install

install()
sys.modules[__name__] = __import__(TARGET, fromlist=["_"])
