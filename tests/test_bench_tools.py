"""CPU tests of the benchmark tools under benches/ that the device runs rely on."""

import importlib.util
import pathlib

import pytest

BENCHES = pathlib.Path(__file__).resolve().parent.parent / "benches"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCHES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ncu_source = _load("ncu_source")

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"# Samples","Instructions Executed","Thread Instructions Executed"')


def _page(tmp_path, name, kernel, lines):
    """An ncu source page as `ncu -i REP --page source --csv --print-source sass` writes it."""
    rows = [f'"Kernel Name","{kernel}",', HEADER]
    for i, (source, samples, executed) in enumerate(lines):
        rows.append(f'"0x{i * 16:x}","      {source}","{samples}","0","{samples}","{executed}","{executed * 32}"')
    path = tmp_path / name
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_opcode_drops_predicates_and_modifiers():
    assert ncu_source.opcode("@!P4  LDG.E.64.CONSTANT R30, desc[UR18][R42.64+0x40]") == "LDG"
    assert ncu_source.opcode("@UP0 UIADD3 UR7, UR11, 0x48, URZ") == "UIADD3"
    assert ncu_source.opcode("FMUL R55, R32, R201") == "FMUL"
    assert ncu_source.opcode("") == "?"
    assert ncu_source.count("1,584") == 1584 and ncu_source.count("-") == 0 and ncu_source.count("") == 0


def test_summary_counts_opcodes_lines_and_the_difference(tmp_path, capsys):
    a = _page(tmp_path, "a.csv", "gemm2_tensor", [("LDG.E R2, desc[UR18][R2.64]", 10, 100),
                                                  ("FMUL R1, R2, R3", 5, "1,000"),
                                                  ("@!P0 FMUL R4, R2, R3", 1, 500)])
    b = _page(tmp_path, "b.csv", "gemm2_channel", [("@!P1 LDG.E.64.CONSTANT R2, desc[UR18][R2.64]", 40, 300),
                                                   ("FMUL R1, R2, R3", 60, 2000),
                                                   ("FCHK P0, R2, 448", 7, 50)])
    page = ncu_source.read_page(b)
    assert page.kernel == "gemm2_channel" and page.executed == 2350 and page.samples == 107
    executed, samples = ncu_source.by_opcode(ncu_source.read_page(a))
    assert executed == {"LDG": 100, "FMUL": 1500} and samples == {"LDG": 10, "FMUL": 6}
    assert ncu_source.main([a, b, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "== gemm2_tensor: 1,600 instructions executed, 16 stall samples, 3 SASS lines" in out
    fmul = next(line for line in out.splitlines() if line.startswith("FMUL"))
    assert fmul.split() == ["FMUL", "1,500", "6", "2,000", "60", "+500", "+54"]
    # opcodes by samples, the most first; FCHK appears only in the second kernel
    table = [line.split()[0] for line in out.splitlines()[4:7]]
    assert table == ["FMUL", "LDG", "FCHK"]
    # the two lines with the most samples of the second kernel, in order
    listing = out.split("lines with the most stall samples, gemm2_channel")[1].splitlines()[1:3]
    assert [line.split()[0] for line in listing] == ["1", "0"]


def test_a_file_that_is_not_a_source_page_is_refused(tmp_path, capsys):
    details = tmp_path / "details.txt"
    details.write_text("    Duration                         us       492.64\n")
    assert ncu_source.main([str(details)]) == 2
    assert "no header row with 'Source' and 'Instructions Executed'" in capsys.readouterr().err
    no_samples = tmp_path / "no_samples.csv"
    no_samples.write_text('"Address","Source","Instructions Executed"\n"0x0","FMUL R1, R2, R3","4"\n')
    with pytest.raises(ncu_source.SourcePageError, match="WarpStateStats"):
        ncu_source.read_page(str(no_samples))
    with pytest.raises(SystemExit):
        ncu_source.main([str(details)] * 3)
