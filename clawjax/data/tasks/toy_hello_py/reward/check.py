"""Sub-scores for toy_hello_py: the script exists, runs, and prints the exact line."""
import json
import pathlib
import subprocess
import sys

ws = pathlib.Path(sys.argv[1])
script = ws / "hello.py"
runs = prints = 0.0
if script.is_file():
  try:
    out = subprocess.run([sys.executable, str(script)], cwd=ws, capture_output=True, text=True,
                         timeout=10)
    runs = float(out.returncode == 0)
    prints = float(out.stdout.strip() == "Hello, clawjax!")
  except subprocess.TimeoutExpired:
    pass
print(json.dumps({"hello_exists": float(script.is_file()), "hello_runs": runs,
                  "hello_prints": prints}))
