# lit configuration for bmt. Substitutions:
#   %fixtures  directory of the TorchScript fixtures (test/fixtures/make_fixtures.py)
#   %python    the Python that has torch and transformers
#   %expect-exit CODE CMD...  runs CMD and succeeds only if it exits with CODE
import os
import lit.formats

config.name = "bmt"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "fixtures", "unit", "expect_exit.py", "check_globals.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.bmt_obj_root, "test")

# bmt-opt first, then FileCheck, not, count from LLVM's tools directory.
config.environment["PATH"] = os.pathsep.join(
    [config.bmt_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", os.environ["PATH"])])
config.substitutions.append(("%fixtures", config.fixtures_dir))
config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(
    ("%expect-exit", config.python_executable + " " + os.path.join(config.test_source_root, "expect_exit.py")))
