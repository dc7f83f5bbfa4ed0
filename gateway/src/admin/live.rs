//! `GET /admin/events`: the live feed of the blocked-responses page, as Server-Sent Events.
//! Each audit record this replica writes that matches the page's filters is sent as the
//! table row [`super::blocked::row`] renders (escaped on the server, like the page), in an
//! `audit` event; a `lagged` event says how many records a slow reader missed. The feed ends
//! when the session is logged out or expires.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Extension;
use futures::Stream;
use tokio::sync::broadcast::error::RecvError;

use super::blocked::{row, Filters};
use super::session::Session;
use super::{Admin, AdminError};
use crate::state::AppState;

pub async fn events(
    session: Session,
    State(state): State<Arc<AppState>>,
    Extension(admin): Extension<Arc<Admin>>,
    Query(filters): Query<Filters>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, AdminError> {
    let (query, _) = filters.to_query();
    let feed = Feed { records: state.protection.subscribe(), admin, session: session.id, query };
    let stream =
        futures::stream::unfold(feed, |mut feed| async move { feed.next().await.map(|event| (Ok(event), feed)) });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

struct Feed {
    records: tokio::sync::broadcast::Receiver<Arc<crate::audit::AuditRecord>>,
    admin: Arc<Admin>,
    session: String,
    query: crate::audit::AuditQuery,
}

impl Feed {
    /// The next event to send, or `None` when the feed is over.
    async fn next(&mut self) -> Option<Event> {
        loop {
            let received = self.records.recv().await;
            if !self.admin.sessions.is_live(&self.session) {
                return None;
            }
            match received {
                Ok(record) if self.query.matches(&record) => {
                    return Some(Event::default().event("audit").data(row(&record)))
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(missed)) => {
                    return Some(Event::default().event("lagged").data(missed.to_string()))
                }
                Err(RecvError::Closed) => return None,
            }
        }
    }
}
