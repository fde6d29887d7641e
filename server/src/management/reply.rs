//! How the API answers what it refuses, in RabbitMQ's words: a JSON body with `error` and
//! `reason`, and the status code RabbitMQ gives.

use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// How long a request may take, its body read included.
pub const REQUEST_TIME: Duration = Duration::from_secs(30);

/// A refusal: its status, RabbitMQ's `error` word and the `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// RabbitMQ's `error`: `not_authorised`, `Object Not Found`, `bad_request`, …
    pub error: &'static str,
    /// What was wrong.
    pub reason: String,
}

impl ApiError {
    /// 401: no credentials, wrong ones, or a user whose tags do not allow the request.
    pub fn not_authorised(reason: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            error: "not_authorised",
            reason: reason.into(),
        }
    }

    /// 401 for credentials that do not log in, in RabbitMQ's words (`not_authorized`, with
    /// a z, where a refused tag says `not_authorised`); an empty body where none were
    /// given.
    pub fn login_failed(given: bool) -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            error: if given { "not_authorized" } else { "" },
            reason: "Login failed".to_string(),
        }
    }

    /// 404, as RabbitMQ words it for an object that does not exist.
    pub fn not_found() -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            error: "Object Not Found",
            reason: "Not Found".to_string(),
        }
    }

    /// 400: a body or parameter that does not read.
    pub fn bad_request(reason: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            error: "bad_request",
            reason: reason.into(),
        }
    }

    /// 500: something the server could not do (a broker that shut down, a disk error).
    pub fn internal(reason: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error: "internal_server_error",
            reason: reason.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = match self.error {
            // No credentials: RabbitMQ answers with the header alone.
            "" => self.status.into_response(),
            error => {
                let body = serde_json::json!({"error": error, "reason": self.reason});
                (self.status, Json(body)).into_response()
            }
        };
        if self.status == StatusCode::UNAUTHORIZED {
            // As RabbitMQ, so that a browser asks for credentials.
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"RabbitMQ Management\""),
            );
        }
        response
    }
}

/// What a handler answers.
pub type Answer<T> = Result<T, ApiError>;

/// The answer to a path no route takes.
pub async fn not_found() -> ApiError {
    ApiError::not_found()
}

/// Runs a request within [`REQUEST_TIME`]: one that takes longer (a body that trickles
/// in) is answered 408 and its connection closed. A refusal of a script's request (one
/// with `X-Requested-With`, as the console sends) has no `WWW-Authenticate`, so that the
/// browser leaves the login to the page instead of asking itself.
pub async fn bounded(request: Request, next: Next) -> Response {
    let scripted = request.headers().contains_key("x-requested-with");
    match tokio::time::timeout(REQUEST_TIME, next.run(request)).await {
        Ok(mut response) => {
            if scripted {
                response.headers_mut().remove(header::WWW_AUTHENTICATE);
            }
            response
        }
        Err(_) => {
            let mut response = ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                error: "timeout",
                reason: format!("the request took over {REQUEST_TIME:?}"),
            }
            .into_response();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}
