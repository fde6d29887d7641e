//! `--definitions`: arbitrary bytes read as a RabbitMQ definitions file. Reading and
//! checking it never panics; a file that is taken (users, hashes, vhosts, permission
//! regexes all good) comes back the same through what the data dir keeps of it, and every
//! user it defines can be tried with any password.

#![no_main]

use leasemq_server::access::{Access, Definitions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(definitions) = Definitions::parse(text) else {
        return;
    };
    let _ = definitions.skipped();
    let Ok(access) = Access::from_definitions(&definitions) else {
        return;
    };
    // What a data dir keeps reads back to the same users, vhosts and permissions.
    let kept = access.to_definitions();
    let json = serde_json::to_string(&kept).expect("definitions serialise");
    let again = Access::from_definitions(&Definitions::parse(&json).expect("kept file reads"))
        .expect("kept definitions are taken");
    let kept_again = again.to_definitions();
    assert_eq!(
        serde_json::to_string(&kept_again).unwrap(),
        json,
        "kept definitions changed on a second round"
    );
    for user in &definitions.users {
        let _ = access.log_in(&user.name, data, true);
        for v in access.vhosts() {
            let _ = access.permissions(&user.name, &v);
        }
    }
});
