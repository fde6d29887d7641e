use super::*;

/// The password "test12" with RabbitMQ's guide's salt (see `hash.rs`).
const TEST12: &str = "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR";

fn definitions(users: &str, vhosts: &str, permissions: &str) -> Definitions {
    let text =
        format!(r#"{{"users": [{users}], "vhosts": [{vhosts}], "permissions": [{permissions}]}}"#);
    Definitions::parse(&text).unwrap()
}

fn app_user() -> String {
    format!(
        r#"{{"name": "app", "password_hash": "{TEST12}", "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}}"#
    )
}

#[test]
fn a_defined_user_logs_in_with_its_password_only() {
    let access = Access::from_definitions(&definitions(
        &app_user(),
        r#"{"name": "/"}"#,
        r#"{"user": "app", "vhost": "/", "configure": "", "write": ".*", "read": "^jobs$"}"#,
    ))
    .unwrap();
    let user = access.log_in("app", b"test12", false).unwrap();
    assert_eq!(user.name, "app");
    assert_eq!(
        access.log_in("app", b"test13", true).unwrap_err(),
        LoginRefused::Credentials
    );
    assert_eq!(
        access.log_in("nobody", b"test12", true).unwrap_err(),
        LoginRefused::Credentials
    );
    let p = access.permissions("app", "/").unwrap();
    assert!(!p.allows(Permission::Configure, Resource::Queue, "jobs"));
    assert!(p.allows(Permission::Read, Resource::Queue, "jobs"));
    assert!(access.permissions("app", "other").is_none());
    assert!(access.has_vhost("/") && !access.has_vhost("other"));
}

#[test]
fn guest_logs_in_from_loopback_only_and_a_user_without_a_hash_never() {
    let access = Access::default();
    assert!(access.log_in("guest", b"guest", true).is_ok());
    assert_eq!(
        access.log_in("guest", b"guest", false).unwrap_err(),
        LoginRefused::LoopbackOnly
    );
    // A wrong password is refused as such wherever it comes from.
    assert_eq!(
        access.log_in("guest", b"gues", false).unwrap_err(),
        LoginRefused::Credentials
    );
    let one = Access::one_user("admin", "pw");
    assert!(one.log_in("admin", b"pw", false).is_ok());
    assert!(one.permissions("admin", "/").is_some());
    assert!(one.log_in("guest", b"guest", true).is_err());

    let access = Access::from_definitions(&definitions(
        r#"{"name": "cert-only", "password_hash": "", "tags": ""}"#,
        "",
        "",
    ))
    .unwrap();
    assert_eq!(
        access.log_in("cert-only", b"", true).unwrap_err(),
        LoginRefused::Credentials
    );
}

#[test]
fn definitions_that_do_not_hold_together_are_refused_naming_the_entry() {
    let cases = [
        (
            definitions(&format!("{},{}", app_user(), app_user()), "", ""),
            "user \"app\" is defined twice",
        ),
        (
            definitions(
                r#"{"name": "a", "password_hash": "x", "hashing_algorithm": "rabbit_password_hashing_md5"}"#,
                "",
                "",
            ),
            "user \"a\": hashing_algorithm \"rabbit_password_hashing_md5\"",
        ),
        (
            definitions(r#"{"name": "a", "password_hash": "c2hvcnQ="}"#, "", ""),
            "user \"a\": password_hash holds 5 bytes",
        ),
        (
            definitions(
                &app_user(),
                "",
                r#"{"user": "app", "vhost": "nope", "configure": "", "write": "", "read": ""}"#,
            ),
            "permissions of user \"app\" in vhost \"nope\": no such vhost",
        ),
        (
            definitions(
                "",
                "",
                r#"{"user": "ghost", "vhost": "/", "configure": "", "write": "", "read": ""}"#,
            ),
            "permissions of user \"ghost\" in vhost \"/\": no such user",
        ),
        (
            definitions(
                &app_user(),
                "",
                r#"{"user": "app", "vhost": "/", "configure": ".*", "write": "(", "read": ""}"#,
            ),
            "permissions of user \"app\" in vhost \"/\": write \"(\"",
        ),
    ];
    for (d, says) in cases {
        let e = Access::from_definitions(&d).unwrap_err();
        assert!(e.contains(says), "{e}");
    }
    let d = Definitions::parse(r#"{"queues": [{"name": "q", "vhost": "v"}]}"#).unwrap();
    let e = Access::from_definitions(&d).unwrap_err();
    assert!(e.contains("queue \"q\": no such vhost \"v\""), "{e}");
}

#[test]
fn a_data_dir_keeps_what_the_file_defined_and_is_read_before_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("definitions.json");
    let first = definitions(
        &app_user(),
        r#"{"name": "orders"}"#,
        r#"{"user": "app", "vhost": "orders", "configure": "^app-", "write": ".*", "read": ".*"}"#,
    );
    assert!(Access::load(Some(dir.path()), None).unwrap().is_none());
    let loaded = Access::load(Some(dir.path()), Some((&file, &first)))
        .unwrap()
        .unwrap();
    assert!(loaded.log_in("app", b"test12", false).is_ok());
    assert!(dir.path().join(ACCESS_FILE).exists());

    // A later start with another file: the data dir's users stand.
    let second = definitions(r#"{"name": "other", "password_hash": ""}"#, "", "");
    let again = Access::load(Some(dir.path()), Some((&file, &second)))
        .unwrap()
        .unwrap();
    assert!(again.log_in("app", b"test12", false).is_ok());
    assert!(again.has_vhost("orders"));
    let p = again.permissions("app", "orders").unwrap();
    assert_eq!(p.configure.source(), "^app-");
    assert!(again.log_in("other", b"", true).is_err());
    // And without one.
    let without = Access::load(Some(dir.path()), None).unwrap().unwrap();
    assert!(without.log_in("app", b"test12", true).is_ok());

    // A kept file that no longer reads stops the start, named.
    std::fs::write(dir.path().join(ACCESS_FILE), "{").unwrap();
    let e = Access::load(Some(dir.path()), None).unwrap_err();
    assert!(e.contains(ACCESS_FILE), "{e}");
}
