//! Passwords as RabbitMQ stores them: base64 of a 4-byte salt followed by the hash of
//! salt ‖ password, with SHA-256 (`rabbit_password_hashing_sha256`, RabbitMQ's default)
//! or SHA-512 (`rabbit_password_hashing_sha512`). A definitions file exported by RabbitMQ
//! carries these, so its users log in with the passwords they had there.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// How long RabbitMQ's salt is.
const SALT_BYTES: usize = 4;

/// The hash function of a password hash, by RabbitMQ's name for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// `rabbit_password_hashing_sha256`.
    Sha256,
    /// `rabbit_password_hashing_sha512`.
    Sha512,
}

impl Algorithm {
    /// The algorithm RabbitMQ names `name`; `None` for one leasemqd does not take (MD5,
    /// RabbitMQ's before 3.6, among them).
    pub fn named(name: &str) -> Option<Algorithm> {
        match name {
            "rabbit_password_hashing_sha256" => Some(Algorithm::Sha256),
            "rabbit_password_hashing_sha512" => Some(Algorithm::Sha512),
            _ => None,
        }
    }

    /// RabbitMQ's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "rabbit_password_hashing_sha256",
            Algorithm::Sha512 => "rabbit_password_hashing_sha512",
        }
    }

    fn digest_bytes(self) -> usize {
        match self {
            Algorithm::Sha256 => 32,
            Algorithm::Sha512 => 64,
        }
    }

    fn hash(self, salt: &[u8], password: &[u8]) -> Vec<u8> {
        match self {
            Algorithm::Sha256 => Sha256::new()
                .chain_update(salt)
                .chain_update(password)
                .finalize()
                .to_vec(),
            Algorithm::Sha512 => Sha512::new()
                .chain_update(salt)
                .chain_update(password)
                .finalize()
                .to_vec(),
        }
    }
}

/// A salted password hash; it never holds the password.
#[derive(Clone, PartialEq, Eq)]
pub struct PasswordHash {
    algorithm: Algorithm,
    /// The salt, then the hash: as stored, base64-decoded.
    stored: Vec<u8>,
}

impl std::fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordHash")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

impl PasswordHash {
    /// The hash of `password` with a fresh random salt.
    pub fn new(algorithm: Algorithm, password: &[u8]) -> PasswordHash {
        let mut salt = [0u8; SALT_BYTES];
        getrandom::fill(&mut salt).expect("the system's random source");
        PasswordHash::with_salt(algorithm, salt, password)
    }

    /// The hash of `password` with `salt`.
    pub fn with_salt(
        algorithm: Algorithm,
        salt: [u8; SALT_BYTES],
        password: &[u8],
    ) -> PasswordHash {
        let mut stored = salt.to_vec();
        stored.extend(algorithm.hash(&salt, password));
        PasswordHash { algorithm, stored }
    }

    /// Reads a stored hash (`password_hash` of a definitions file): an error says what is
    /// wrong with it, never what it holds.
    pub fn parse(algorithm: Algorithm, base64: &str) -> Result<PasswordHash, String> {
        let stored = BASE64
            .decode(base64.trim())
            .map_err(|e| format!("password_hash is not base64: {e}"))?;
        let expected = SALT_BYTES + algorithm.digest_bytes();
        if stored.len() != expected {
            return Err(format!(
                "password_hash holds {} bytes; {} takes {expected} (a 4-byte salt and the hash)",
                stored.len(),
                algorithm.name()
            ));
        }
        Ok(PasswordHash { algorithm, stored })
    }

    /// Whether `password` is the one hashed; the comparison takes the same time wherever
    /// the hashes differ.
    pub fn verify(&self, password: &[u8]) -> bool {
        let (salt, hash) = self.stored.split_at(SALT_BYTES);
        bool::from(self.algorithm.hash(salt, password).ct_eq(hash))
    }

    /// How it is stored: base64 of the salt and the hash.
    pub fn to_base64(&self) -> String {
        BASE64.encode(&self.stored)
    }

    /// Its algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// base64(salt ‖ SHA-256(salt ‖ password)) for the salt 0x908DC60A and the password
    /// "test12": the worked example of RabbitMQ's "Credentials and Passwords" guide.
    const SHA256_TEST12: &str = "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR";

    #[test]
    fn a_hash_from_rabbitmqs_guide_verifies_its_password_only() {
        let hash = PasswordHash::parse(Algorithm::Sha256, SHA256_TEST12).unwrap();
        assert!(hash.verify(b"test12"));
        assert!(!hash.verify(b"test13"));
        assert!(!hash.verify(b""));
        assert_eq!(hash.to_base64(), SHA256_TEST12);
    }

    #[test]
    fn hashes_made_here_verify_with_either_algorithm_and_differ_by_salt() {
        for algorithm in [Algorithm::Sha256, Algorithm::Sha512] {
            let a = PasswordHash::new(algorithm, b"s3cret");
            let b = PasswordHash::new(algorithm, b"s3cret");
            assert!(a.verify(b"s3cret") && b.verify(b"s3cret"));
            assert!(!a.verify(b"s3cret "));
            let again = PasswordHash::parse(algorithm, &a.to_base64()).unwrap();
            assert_eq!(again, a);
            // Two salts drawn apart are almost surely different.
            assert_ne!(a.to_base64(), b.to_base64());
        }
        let fixed = PasswordHash::with_salt(Algorithm::Sha512, [1, 2, 3, 4], b"pw");
        let mut expected = vec![1, 2, 3, 4];
        expected.extend(Sha512::digest([1, 2, 3, 4, b'p', b'w']));
        assert_eq!(fixed.to_base64(), BASE64.encode(expected));
    }

    #[test]
    fn a_hash_of_the_wrong_length_or_not_base64_is_refused_by_what_is_wrong() {
        let sha512_len = PasswordHash::new(Algorithm::Sha512, b"x").to_base64();
        let e = PasswordHash::parse(Algorithm::Sha256, &sha512_len).unwrap_err();
        assert!(e.contains("68 bytes") && e.contains("takes 36"), "{e}");
        let e = PasswordHash::parse(Algorithm::Sha256, "not base64!").unwrap_err();
        assert!(e.contains("not base64"), "{e}");
        assert_eq!(Algorithm::named("rabbit_password_hashing_md5"), None);
    }
}
