//! The CoT-based synthesizer's prompt: the question, the candidates numbered,
//! and an instruction to weigh them and reason to an answer of its own, which
//! may differ from every candidate.

/// Longest stretch of one candidate quoted to the synthesizer, in characters;
/// longer ones keep their end, where the final answer is.
const MAX_CANDIDATE_CHARS: usize = 2000;

/// The synthesis prompt for `question` and its candidate `responses`.
pub fn synthesis_prompt(question: &str, responses: &[&str]) -> String {
    let mut p = String::new();
    p.push_str("You are checking other people's work on a problem.\n\nProblem:\n");
    p.push_str(question.trim());
    p.push_str(&format!(
        "\n\nBelow are {} attempted solutions. Any of them, or all of them, may contain mistakes.\n",
        responses.len()
    ));
    for (i, r) in responses.iter().enumerate() {
        let r = r.trim();
        let shown = if r.chars().count() > MAX_CANDIDATE_CHARS {
            let skip = r.chars().count() - MAX_CANDIDATE_CHARS;
            let tail: String = r.chars().skip(skip).collect();
            format!("...{tail}")
        } else {
            r.to_string()
        };
        p.push_str(&format!("\nSolution {}:\n{}\n", i + 1, shown));
    }
    p.push_str(
        "\nCompare the solutions: note where they agree, where they differ and which steps are \
         wrong. Then solve the problem yourself step by step, using what is right in them. \
         End with one line of the form \"The answer is X\".",
    );
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_every_candidate_and_keeps_long_tails() {
        let long = format!("{}The answer is 7", "x".repeat(5000));
        let p = synthesis_prompt("What is 3+4?", &["It is 8.", &long]);
        assert!(p.contains("Problem:\nWhat is 3+4?"));
        assert!(p.contains("Solution 1:\nIt is 8."));
        assert!(p.contains("Solution 2:\n..."));
        assert!(p.contains("The answer is 7"));
        assert!(p.len() < 3000);
        assert!(p.ends_with("\"The answer is X\"."));
    }
}
