//! The spreadsheet setting on `POST /v1/chat/completions` (Tern's
//! `spreadsheet` extension, sent with `extra_body`): the client sends its
//! own workbooks (base64 `.xlsx`, test cases sharing one layout, the first
//! shown to the model), the answer position and the instruction (the last
//! user message); the served model writes openpyxl programs, each is run on
//! every workbook in the sandbox, and with `best_of` the program whose
//! outputs the others agree with is chosen. With `rounds`, a program that
//! crashed, timed out or wrote no answer sees that and writes again
//! (SpreadsheetBench's multi-round setting, shown nothing a client without
//! answers could not see). The answer is the chosen reply, and the `tern`
//! object carries every candidate's program and the chosen program's output
//! workbooks. The work is `tern_solve::eval::spreadsheet_best`, as in
//! `tern bon --spreadsheet`; it needs `--allow-code-execution`.

use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::EngineHandle;
use tern_solve::eval::spreadsheet_best::{best_of_cases, blind_feedback, BestOfSettings};
use tern_solve::eval::EvalError;
use tern_solve::reasoning::ReasoningError;
use tern_solve::tasks::spreadsheet::{prompt_for, Case, PromptBudget, PromptParts, Source};
use tern_solve::verify::spreadsheet::select::supports;
use tern_solve::verify::spreadsheet::{
    answer_cells, read_workbook, run_outputs, workbook_limits, WorkbookReport,
};
use tern_solve::verify::JudgeError;

use crate::openai::error::ApiError;
use crate::openai::ResponseMeta;
use crate::params::Plan;

/// Most workbooks one request may send.
pub const MAX_WORKBOOKS: usize = 8;
/// Largest workbook, decoded.
pub const MAX_WORKBOOK_BYTES: usize = 4 * 1024 * 1024;
/// Most candidates (`best_of`).
pub const MAX_CANDIDATES: usize = 8;
/// Most rounds per candidate.
pub const MAX_ROUNDS: usize = 10;

/// The `spreadsheet` object as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SheetFields {
    /// Base64 `.xlsx` files; the first is shown to the model.
    workbooks: Vec<String>,
    /// The answer range (`'Sheet1'!D2:D9`).
    answer_position: String,
    /// `cell` (default: fill the cells named) or `sheet` (the answer is a
    /// whole table within the range).
    #[serde(default)]
    instruction_type: Option<String>,
    /// Rounds per candidate (default 1).
    #[serde(default)]
    rounds: Option<i64>,
}

/// A validated spreadsheet request, ready to run.
pub struct SheetRequest {
    opening: Vec<ChatMessage>,
    cases: Vec<Case>,
    settings: BestOfSettings,
    answer_position: String,
}

impl SheetRequest {
    /// The conversation the candidates start from (for its token count).
    pub fn opening(&self) -> &[ChatMessage] {
        &self.opening
    }
}

/// Reads and checks the `spreadsheet` object against the generation
/// `plan`, builds the prompt from the last user message and the first
/// workbook, and the test cases from every workbook. Without
/// `allow_code` (`--allow-code-execution`) it is a 403.
pub fn request(
    raw: &serde_json::Value,
    best_of: Option<i64>,
    messages: &[ChatMessage],
    plan: &Plan,
    allow_code: bool,
) -> Result<SheetRequest, ApiError> {
    if !allow_code {
        return Err(ApiError::code_execution_disabled("spreadsheet"));
    }
    let fields: SheetFields = serde_json::from_value(raw.clone())
        .map_err(|e| ApiError::invalid_param("spreadsheet", format!("spreadsheet: {e}")))?;
    if plan.stream {
        return Err(ApiError::unsupported(
            "stream",
            "streaming with spreadsheet",
        ));
    }
    if plan.submit.n != 1 {
        return Err(ApiError::invalid_param(
            "n",
            "n must be 1 with spreadsheet (use best_of for several programs)",
        ));
    }
    let n = best_of.unwrap_or(1);
    if !(1..=MAX_CANDIDATES as i64).contains(&n) {
        return Err(ApiError::invalid_param(
            "best_of",
            format!("best_of must be between 1 and {MAX_CANDIDATES} with spreadsheet, got {n}"),
        ));
    }
    let rounds = fields.rounds.unwrap_or(1);
    if !(1..=MAX_ROUNDS as i64).contains(&rounds) {
        return Err(ApiError::invalid_param(
            "spreadsheet.rounds",
            format!("rounds must be between 1 and {MAX_ROUNDS}, got {rounds}"),
        ));
    }
    let sheet_level = match fields.instruction_type.as_deref() {
        None | Some("cell") => false,
        Some("sheet") => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "spreadsheet.instruction_type",
                format!("unknown instruction_type `{other}`; use `cell` or `sheet`"),
            ))
        }
    };
    if fields.workbooks.is_empty() || fields.workbooks.len() > MAX_WORKBOOKS {
        return Err(ApiError::invalid_param(
            "spreadsheet.workbooks",
            format!(
                "send 1 to {MAX_WORKBOOKS} workbooks, got {}",
                fields.workbooks.len()
            ),
        ));
    }
    let instruction = messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .map(|m| m.content.trim())
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            ApiError::invalid_param(
                "messages",
                "spreadsheet needs the instruction as the last user message",
            )
        })?;
    let mut cases = Vec::with_capacity(fields.workbooks.len());
    let mut shown = None;
    for (i, text) in fields.workbooks.iter().enumerate() {
        let param = format!("spreadsheet.workbooks[{i}]");
        // A base64 text is 4/3 of its bytes: refuse before decoding a huge one.
        if text.len() > MAX_WORKBOOK_BYTES / 3 * 4 + 4 {
            return Err(ApiError::invalid_param(
                param,
                format!("a workbook may be at most {MAX_WORKBOOK_BYTES} bytes"),
            ));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| ApiError::invalid_param(&param, format!("not base64: {e}")))?;
        let book = read_workbook(&bytes).map_err(|e| ApiError::invalid_param(&param, e))?;
        let expected = answer_cells(&fields.answer_position, &book)
            .map_err(|e| ApiError::invalid_param("spreadsheet.answer_position", e))?;
        cases.push(Case {
            input: Source::Bytes(bytes),
            expected,
        });
        shown.get_or_insert(book);
    }
    let parts = PromptParts {
        instruction,
        answer_position: &fields.answer_position,
        sheet_level,
        shown: shown.as_ref(),
    };
    // The request's system turns stay; the user turn is the setting's prompt.
    let mut opening: Vec<ChatMessage> = messages
        .iter()
        .filter(|m| m.role == "system" || m.role == "developer")
        .cloned()
        .collect();
    opening.push(ChatMessage::new(
        "user",
        prompt_for(&parts, PromptBudget::default()).as_str(),
    ));
    let settings = BestOfSettings {
        n: n as usize,
        temperature: plan.submit.sampling.temperature,
        top_p: plan.submit.sampling.top_p,
        max_tokens: plan.submit.max_tokens,
        seed: plan.submit.sampling.seed,
        kv_policy: plan.submit.kv_policy.clone(),
        parallel: 1,
        budget: PromptBudget::default(),
        limits: workbook_limits(),
        rounds: rounds as usize,
    };
    Ok(SheetRequest {
        opening,
        cases,
        settings,
        answer_position: fields.answer_position,
    })
}

/// Runs the candidates off the async runtime, reruns the chosen program
/// for its output workbooks, and answers with the chosen reply.
pub async fn respond(
    engine: EngineHandle,
    req: SheetRequest,
    meta: ResponseMeta,
    prompt_tokens: usize,
) -> Result<Response, ApiError> {
    let policy = req.settings.kv_policy.to_string();
    // Dropped with this future when the client disconnects: the judge then
    // kills its running programs and starts no more.
    let _cancel_on_disconnect = req.settings.limits.cancel.on_drop();
    let SheetRequest {
        opening,
        cases,
        settings,
        answer_position,
    } = req;
    let n = settings.n;
    let rounds_asked = settings.rounds;
    let (run, outputs) = tokio::task::spawn_blocking(move || {
        let run = best_of_cases(&engine, opening, &cases, &settings, settings.seed)?;
        let chosen = run.by_round.last().map_or(0, |c| c.agree);
        let program = &run.candidates[chosen].last().program;
        let outputs = run_outputs(program, &cases, &settings.limits).map_err(EvalError::Judge)?;
        Ok::<_, EvalError>((run, outputs))
    })
    .await
    .map_err(|e| ApiError::internal(format!("spreadsheet failed: {e}")))?
    .map_err(|e| match e {
        EvalError::Reasoning(ReasoningError::Submit(s)) => ApiError::from_submit(s, "messages"),
        EvalError::Judge(JudgeError::Cancelled) => ApiError::internal("cancelled"),
        other => ApiError::internal(other.to_string()),
    })?;
    let chosen = run.by_round.last().map_or(0, |c| c.agree);
    let reports: Vec<WorkbookReport> = run
        .candidates
        .iter()
        .map(|t| t.last().report.clone())
        .collect();
    let support = supports(&reports);
    let tokens: usize = run
        .candidates
        .iter()
        .flat_map(|t| &t.rounds)
        .map(|j| j.tokens)
        .sum();
    let candidates: Vec<_> = run
        .candidates
        .iter()
        .zip(&support)
        .map(|(t, s)| {
            let last = t.last();
            json!({
                "program": last.program,
                "rounds": t.rounds.len(),
                "tokens": t.rounds.iter().map(|j| j.tokens).sum::<usize>(),
                "answered": s.answered,
                "agreements": s.agreements,
                // What its last program showed without any answer: a crash,
                // a timeout or a missing answer on some workbook.
                "problem": blind_feedback(&last.report),
            })
        })
        .collect();
    let outputs: Vec<_> = outputs
        .into_iter()
        .map(|o| match o {
            Ok(bytes) => {
                json!({"workbook": base64::engine::general_purpose::STANDARD.encode(bytes)})
            }
            Err(error) => json!({"error": error}),
        })
        .collect();
    // Every generated token is billed: every candidate's every round.
    let content = &run.candidates[chosen].reply;
    let body = super::best_of::one_choice(
        meta,
        content,
        prompt_tokens,
        tokens,
        json!({
                "kv_policy": policy,
                "best_of": n,
                "aggregate": "agree",
                "chosen": chosen,
                "rounds": rounds_asked,
                "rounds_run": run.by_round.len(),
                // The candidate chosen by agreement after each round.
                "chosen_by_round": run.by_round.iter().map(|c| c.agree).collect::<Vec<_>>(),
                "candidates": candidates,
                "spreadsheet": {
                    "answer_position": answer_position,
                    // The chosen program's output.xlsx for each workbook sent
                    // (base64), or why it wrote none.
                    "outputs": outputs,
                },
        }),
    );
    Ok(Json(body).into_response())
}
