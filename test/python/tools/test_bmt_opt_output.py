"""bmt-opt writes an output that is not a regular file (a FIFO here; /dev/null
in practice) in place: renaming a temporary file over it, as it does for
files so that a failure leaves the old one, would replace it (as root,
`bmt-opt ... -o /dev/null` turned /dev/null into a regular file)."""
import os
import stat
import subprocess
import threading

from bmt_paths import binary

PROGRAM = """
bmt.parameter @proj.weight : tensor<8x8xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %w = bmt.get_global @proj.weight : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
"""


def test_output_to_a_fifo_is_written_in_place(tmp_path):
    src, fifo = tmp_path / "in.mlir", tmp_path / "out.fifo"
    src.write_text(PROGRAM)
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    r = subprocess.run([binary("bmt-opt"), str(src), "-o", str(fifo)], capture_output=True,
                       text=True, timeout=60)
    reader.join(timeout=20)  # never returns if the FIFO was replaced
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO was replaced"
    assert got and "bmt.get_global @proj.weight" in got[0]
    assert sorted(os.listdir(tmp_path)) == ["in.mlir", "out.fifo"]  # no temporary left
