rule aggregate:
    input:
        metrics=study_metrics,
        extra=MERGE_RUNS,
        profiles=study_profiles,
    output:
        parquet="results/studies/{study}/runs.parquet",
        replaced="results/studies/{study}/replaced.parquet",
        csv="results/studies/{study}/runs.csv",
        html=report(
            "results/studies/{study}/runs.html",
            caption="../report/runs.rst",
            category="{study}",
            subcategory="Runs",
            labels={"table": "all runs"},
        ),
    log:
        "logs/aggregate/{study}.log",
    benchmark:
        "benchmarks/aggregate/{study}.tsv"
    conda:
        "../envs/report.yaml"
    params:
        title=study_title,
        pool=study_variant_pool,
    script:
        "../workflow/scripts/aggregate.py"


rule figures:
    input:
        runs="results/studies/{study}/runs.parquet",
        profiles=study_profiles,
    output:
        step_time=report(
            "results/studies/{study}/step_time.svg",
            caption="../report/step_time.rst",
            category="{study}",
            subcategory="Figures",
            labels={"figure": "step time vs batch size"},
        ),
        memory=report(
            "results/studies/{study}/memory.svg",
            caption="../report/memory.rst",
            category="{study}",
            subcategory="Figures",
            labels={"figure": "peak memory vs batch size"},
        ),
        throughput=report(
            "results/studies/{study}/throughput.svg",
            caption="../report/throughput.rst",
            category="{study}",
            subcategory="Figures",
            labels={"figure": "samples per hour vs batch size"},
        ),
        first_step=report(
            "results/studies/{study}/first_step.svg",
            caption="../report/first_step.rst",
            category="{study}",
            subcategory="Figures",
            labels={"figure": "first step (compilation) vs batch size"},
        ),
    log:
        "logs/figures/{study}.log",
    benchmark:
        "benchmarks/figures/{study}.tsv"
    conda:
        "../envs/report.yaml"
    script:
        "../workflow/scripts/figures.py"


rule token_table:
    input:
        token_stats_inputs,
    output:
        html=report(
            "results/token_stats/token_stats.html",
            caption="../report/token_stats.rst",
            category="Data",
            subcategory="Token statistics",
            labels={"table": "token statistics"},
        ),
        figure=report(
            "results/token_stats/token_stats.svg",
            caption="../report/token_stats.rst",
            category="Data",
            subcategory="Token statistics",
            labels={"table": "tokens per sample"},
        ),
    log:
        "logs/token_table.log",
    benchmark:
        "benchmarks/token_table.tsv"
    conda:
        "../envs/report.yaml"
    script:
        "../workflow/scripts/token_table.py"


rule compare:
    input:
        runs="results/studies/{study}/runs.parquet",
        replaced="results/studies/{study}/replaced.parquet",
        published=published_file,
        quality=study_quality_verdicts,
    output:
        report(
            "results/studies/{study}/comparison.html",
            caption="../report/comparison.rst",
            category="{study}",
            subcategory="Comparisons",
            labels={"table": "comparison with the published study"},
        ),
    log:
        "logs/compare/{study}.log",
    benchmark:
        "benchmarks/compare/{study}.tsv"
    conda:
        "../envs/report.yaml"
    params:
        title=study_title,
        comparisons=study_comparisons,
        variants=study_variant_table,
        pool=study_variant_pool,
    script:
        "../workflow/scripts/compare.py"


rule coverage:
    input:
        runs=coverage_runs,
        extra=MERGE_RUNS,
        shipped=SHIPPED_RUNS,
        published=coverage_published,
        quality=front_quality_verdicts,
    output:
        html=report(
            "results/coverage/coverage.html",
            caption="../report/coverage.rst",
            category="Coverage",
            labels={"table": "published cells measured at full scale"},
        ),
        front="results/coverage/front.html",
        csv="results/coverage/coverage.csv",
    log:
        "logs/coverage.log",
    benchmark:
        "benchmarks/coverage.tsv"
    conda:
        "../envs/report.yaml"
    params:
        tables=coverage_tables(),
        across_code=config.get("merge_across_code", False),
        frontier=llm_frontier(),
        pool=ftc.all_variants(config),
        pages=study_pages(),
    script:
        "../workflow/scripts/coverage.py"


rule quality:
    input:
        metrics=quality_metrics,
        shipped=SHIPPED_RUNS,
        answers=quality_answers,
        fp8_errors=fp8_gemm_errors,
    output:
        html=report(
            "results/quality/quality.html",
            caption="../report/quality.rst",
            # the study's own category (its runs and figures are there): one sidebar entry, not "quality" and "Quality"
            category=QUALITY_STUDY,
            subcategory="Verdicts",
            labels={"table": "speed that keeps quality"},
        ),
        front="results/quality/front.html",
        csv="results/quality/verdicts.csv",
    log:
        "logs/quality.log",
    benchmark:
        "benchmarks/quality.tsv"
    conda:
        "../envs/report.yaml"
    params:
        study=QUALITY_STUDY,
        settings=quality_settings,
        variants=quality_variants,
        pool=quality_pool,
        lineage=quality_lineage,
        title=quality_title,
        seed=config["seed"],
    script:
        "../workflow/scripts/quality.py"
