//! What the API changes, it changes as the caller: through an internal connection opened
//! as that user in the virtual host (`internal.rs`), so that its permissions hold as they
//! hold for its AMQP clients, and the change is made and kept as a client's would be.
//! A refusal's AMQP code becomes RabbitMQ's HTTP answer.

use std::sync::Arc;

use super::auth::Caller;
use super::reply::ApiError;
use super::Management;
use crate::internal::Internal;

/// Runs `work` on a blocking thread with an internal connection as `caller` in `vhost`.
pub async fn as_caller<T: Send + 'static>(
    state: &Arc<Management>,
    caller: &Caller,
    vhost: &str,
    work: impl FnOnce(&mut Internal) -> Result<T, (u16, String)> + Send + 'static,
) -> Result<T, ApiError> {
    as_caller_with(state, caller, vhost, work, refused).await
}

/// [`as_caller`], its refusals answered by `answer`.
pub async fn as_caller_with<T: Send + 'static>(
    state: &Arc<Management>,
    caller: &Caller,
    vhost: &str,
    work: impl FnOnce(&mut Internal) -> Result<T, (u16, String)> + Send + 'static,
    answer: fn((u16, String)) -> ApiError,
) -> Result<T, ApiError> {
    caller.vhost_access(vhost)?;
    let state = Arc::clone(state);
    let user = Arc::clone(&caller.user);
    let vhost = vhost.to_string();
    tokio::task::spawn_blocking(move || {
        let mut conn =
            Internal::for_user(&state.broker, &state.settings, &state.vhosts, &vhost, user)
                .map_err(ApiError::not_authorised)?;
        work(&mut conn).map_err(answer)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
}

/// An AMQP refusal as RabbitMQ's API answers it: 403 as 401 `not_authorised`, 404 as
/// 404, a precondition or a lock as 400, anything else as 500; the text without its
/// AMQP code name.
pub fn refused((code, text): (u16, String)) -> ApiError {
    let reason = match text.split_once(" - ") {
        Some((name, rest)) if name.chars().all(|c| c.is_ascii_uppercase() || c == '_') => {
            rest.to_string()
        }
        _ => text,
    };
    match code {
        403 => ApiError::not_authorised("Access refused."),
        404 => ApiError {
            reason,
            ..ApiError::not_found()
        },
        405 | 406 | 503 | 530 | 540 => ApiError::bad_request(reason),
        _ => ApiError::internal(reason),
    }
}

/// A refusal of a publish or a get, as RabbitMQ's API answers those: 400 with the AMQP
/// code and text.
pub fn in_message((code, text): (u16, String)) -> ApiError {
    ApiError::bad_request(format!("{code} {text}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn amqp_refusals_become_rabbitmqs_http_answers() {
        let text = "ACCESS_REFUSED - access to queue 'q' in vhost '/' refused for user 'u'";
        let e = refused((403, text.into()));
        assert_eq!(
            (e.status, e.error),
            (StatusCode::UNAUTHORIZED, "not_authorised")
        );
        assert_eq!(e.reason, "Access refused.");
        let e = refused((
            406,
            "PRECONDITION_FAILED - inequivalent arg 'durable'".into(),
        ));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.reason, "inequivalent arg 'durable'");
        let e = refused((404, "NOT_FOUND - no queue".into()));
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(
            refused((541, "disk".into())).status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let e = in_message((403, "ACCESS_REFUSED - access to exchange 'x'".into()));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.reason, "403 ACCESS_REFUSED - access to exchange 'x'");
    }
}
