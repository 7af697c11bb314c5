//! `GET /`: the embedded chat page (built into the binary, no files at run time).

use axum::response::Html;

/// The page, from `server/static/index.html`.
pub async fn index() -> Html<&'static str> {
    Html(include_str!("../../static/index.html"))
}
