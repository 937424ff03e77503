rule materialize_model:
    output:
        "results/models/{model}/{scale}/model.json",
    log:
        "logs/materialize_model/{model}/{scale}.log",
    benchmark:
        "benchmarks/materialize_model/{model}/{scale}.tsv"
    conda:
        "../envs/train.yaml"
    resources:
        gpu=lambda wildcards: gpus_asked(1, wildcards.scale),
    params:
        model=model_def,
        architecture=architecture_file,
        seed=config["seed"],
        build_limit_gib=config.get("build_limit_gib", 24),
    script:
        "../workflow/scripts/materialize_model.py"


rule cache_latents:
    input:
        model=wildcard_model_manifest,
        train="results/data/{dataset}/train.parquet",
    output:
        "results/cache/{model}/{scale}/{dataset}/latents.pt",
    log:
        "logs/cache_latents/{model}/{scale}/{dataset}.log",
    benchmark:
        "benchmarks/cache_latents/{model}/{scale}/{dataset}.tsv"
    conda:
        "../envs/diffusion.yaml"
    resources:
        gpu=gpus_asked(1),
    params:
        resolution=diffusion_resolution,
        seed=config["seed"],
    script:
        "../workflow/scripts/cache_latents.py"
