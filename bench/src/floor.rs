//! The floor webhook of the benchmarks: parses the AdmissionReview and answers with a fixed
//! one-label patch, with no ring, no key and no metrics. What any webhook pays at least; the
//! sharder webhook is measured against it in the same run.

use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};

/// The path the benchmarks post reviews to (the floor answers on every path).
pub const FLOOR_PATH: &str = "/webhooks/floor";

/// The floor's answer to a review body: a patch adding one fixed label (with the label map when
/// the object has none), or `None` when the body is not a review.
pub fn floor_review(body: &[u8]) -> Option<Vec<u8>> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).ok()?;
    let request: AdmissionRequest<DynamicObject> = review.try_into().ok()?;
    // Like any correct webhook: add the label map when the object has none.
    let has_labels = request
        .object
        .as_ref()
        .is_some_and(|o| o.metadata.labels.is_some());
    let (path, value) = if has_labels {
        ("/metadata/labels/floor", serde_json::json!("shard"))
    } else {
        ("/metadata/labels", serde_json::json!({ "floor": "shard" }))
    };
    let patch = Patch(vec![PatchOperation::Add(AddOperation {
        path: PointerBuf::parse(path).unwrap_or_default(),
        value,
    })]);
    let response = AdmissionResponse::from(&request).with_patch(patch).ok()?;
    serde_json::to_vec(&response.into_review()).ok()
}

/// The floor webhook's routes: every POST path answers with [`floor_review`].
pub fn floor_router() -> Router {
    Router::new().fallback(post(|body: Bytes| async move {
        match floor_review(&body) {
            Some(bytes) => ([(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
            None => StatusCode::BAD_REQUEST.into_response(),
        }
    }))
}
