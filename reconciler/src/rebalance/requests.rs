//! The rebalancer's requests, cut down to what it needs of the answers: a list page is parsed
//! as it arrives and its objects are handed over one by one, cut down to what a move needs
//! ([`super::pages`]); a write asks for the object's metadata only in its answer, and skips even
//! that.

use std::collections::VecDeque;
use std::pin::Pin;

use futures::{AsyncBufRead, AsyncBufReadExt as _};
use kube::Client;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, Request, Resource};

use super::Target;
use super::pages::PageScanner;

/// One page of a metadata-only list, read object by object as it arrives.
pub struct Page {
    body: Pin<Box<dyn AsyncBufRead + Send>>,
    scanner: Option<PageScanner>,
    parsed: VecDeque<ObjectMeta>,
    continue_token: Option<String>,
}

impl Page {
    /// Requests one page of `api`'s objects in `namespace` (`None`: every namespace), metadata
    /// only.
    pub async fn open(
        client: &Client,
        api: &ApiResource,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<Self, kube::Error> {
        let request = Request::new(DynamicObject::url_path(api, namespace))
            .list_metadata(params)
            .map_err(kube::Error::BuildRequest)?;
        Ok(Self {
            body: Box::pin(client.request_stream(request).await?),
            scanner: Some(PageScanner::default()),
            parsed: VecDeque::new(),
            continue_token: None,
        })
    }

    /// The next object of the page, as soon as its text has arrived; `None` after the last.
    pub async fn next(&mut self) -> Result<Option<ObjectMeta>, kube::Error> {
        loop {
            if let Some(meta) = self.parsed.pop_front() {
                return Ok(Some(meta));
            }
            let Some(scanner) = self.scanner.as_mut() else {
                return Ok(None);
            };
            let piece = self
                .body
                .fill_buf()
                .await
                .map_err(kube::Error::ReadEvents)?;
            if piece.is_empty() {
                if let Some(scanner) = self.scanner.take() {
                    self.continue_token = scanner.finish().map_err(kube::Error::SerdeError)?;
                }
                continue;
            }
            let read = piece.len();
            let mut parsed = Vec::new();
            scanner
                .feed(piece, &mut parsed)
                .map_err(kube::Error::SerdeError)?;
            self.body.as_mut().consume(read);
            self.parsed.extend(parsed);
        }
    }

    /// The token of the next page, once [`Self::next`] returned `None` (`None` on the last page).
    pub fn continue_token(&self) -> Option<&str> {
        self.continue_token.as_deref()
    }

    /// The token of the next page as soon as it is known (see
    /// [`PageScanner::continue_token`]): `Some(None)` on the last page, `None` while unknown.
    pub fn early_continue_token(&self) -> Option<Option<&str>> {
        match &self.scanner {
            Some(scanner) => scanner.continue_token(),
            None => Some(self.continue_token.as_deref()),
        }
    }
}

/// Merge-patches object `name` of `target` (in `namespace`) with `patch`; the answer (the
/// object's metadata) is read and dropped unparsed.
pub async fn patch(
    client: &Client,
    target: &Target,
    namespace: Option<&str>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), kube::Error> {
    let namespace = namespace.filter(|_| target.namespaced);
    let request = Request::new(DynamicObject::url_path(&target.api, namespace))
        .patch_metadata(name, &PatchParams::default(), &Patch::Merge(patch))
        .map_err(kube::Error::BuildRequest)?;
    client
        .request::<serde::de::IgnoredAny>(request)
        .await
        .map(|_| ())
}
