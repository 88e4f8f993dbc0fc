"""verify's functional stage (stage 4): upstream's own GPT functional cases (`tests/functional_tests/
test_cases/gpt/<case>/model_config.yaml`), each run with `pretrain_gpt.py` under torchrun, its losses
parsed from the log, compared with this machine's recorded golden (per case and device kind; an FP8
case under the ROCm TE flavour whose golden cannot decide, with its CUDA-path twin instead), and
a checkpoint round trip: the run saves part way, a second run resumes from that checkpoint and must
log the same losses for the remaining iterations. A failing case runs again on the unported tree and
is labelled as stage 3 labels a test; only a port-regression (or an unverified run stopped on a NaN,
Inf or spiky loss) fails the stage.

In CPU-proxy mode every worker gets the proxy shim (`proxy_shim.install_for_script`): torch.cuda's
answers for a CPU, each counted by its call site, plus the HIP simulation when it is on.

The rooms: selection (`--cases`: reach, all, names), case_args (what a case runs with), case_log
(what its log says), details (its typed report data), case_run (one case's runs and checks),
case_labels (the unported tree's run and the label), cases (the cases in turn and the verdict),
stage (the options and the Stage)."""

from rocmport.verify.stages.functional.case_args import (
    CASES,
    NAME,
    PROXY_ENV,
    PROXY_TRAINING,
    RESUME_TOLERANCE,
    TOLERANCE,
    ResumeSupport,
    build_args,
    case_dir,
    cases_near,
    check_case,
    default_case,
    functional_command,
    golden_path,
    load_case,
    missing_data,
    resume_support,
    world_size,
)
from rocmport.verify.stages.functional.case_log import (
    exception_line,
    expected_resumed,
    failure_of,
    loss_steps,
    parse_losses,
)
from rocmport.verify.stages.functional.case_run import (
    CaseOutcome,
    _failure,
    _launch,
    case_sites_env,
    note_case_seconds,
    run_case,
    stage_functional,
)
from rocmport.verify.stages.functional.details import (
    CaseFailure,
    FunctionalRun,
    GoldenComparison,
    ResumeCheck,
    ResumeSkipped,
    UpstreamGolden,
    upstream_golden,
)
from rocmport.verify.stages.functional.cases import CaseEntry, FunctionalCases
from rocmport.verify.stages.functional.stage import STAGE, FunctionalOptions, FunctionalStage, functional_options

__all__ = [
    "CASES",
    "NAME",
    "PROXY_ENV",
    "PROXY_TRAINING",
    "RESUME_TOLERANCE",
    "STAGE",
    "TOLERANCE",
    "CaseEntry",
    "CaseFailure",
    "CaseOutcome",
    "FunctionalCases",
    "FunctionalOptions",
    "FunctionalRun",
    "FunctionalStage",
    "GoldenComparison",
    "ResumeCheck",
    "ResumeSkipped",
    "ResumeSupport",
    "UpstreamGolden",
    "_failure",
    "_launch",
    "build_args",
    "case_dir",
    "case_sites_env",
    "cases_near",
    "check_case",
    "default_case",
    "exception_line",
    "expected_resumed",
    "failure_of",
    "functional_command",
    "functional_options",
    "golden_path",
    "load_case",
    "loss_steps",
    "missing_data",
    "note_case_seconds",
    "parse_losses",
    "resume_support",
    "run_case",
    "stage_functional",
    "upstream_golden",
    "world_size",
]
