//! The JSON Schema of the result document (`schema.json` beside this crate, embedded), and validation
//! against it: the CLI checks every document before writing it, so a schema drift is caught at once.

/// The schema text.
pub(crate) const SCHEMA: &str = include_str!("../schema.json");

/// Why a document did not validate.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The embedded schema is not JSON (a defect of this build).
    #[error("the schema does not parse")]
    Parse(#[source] serde_json::Error),
    /// The embedded schema is not a valid JSON Schema (a defect of this build).
    #[error("the schema is invalid")]
    Invalid(#[source] Box<jsonschema::ValidationError<'static>>),
    /// The document breaks the schema: every violation, as `JSON-pointer: what is wrong`.
    #[error("{}", .0.join("; "))]
    Violations(Vec<String>),
}

/// Validate a document; the error lists every violation with its JSON pointer.
pub fn validate(doc: &serde_json::Value) -> Result<(), SchemaError> {
    let schema: serde_json::Value = serde_json::from_str(SCHEMA).map_err(SchemaError::Parse)?;
    let v = jsonschema::validator_for(&schema).map_err(|e| SchemaError::Invalid(Box::new(e)))?;
    let errs: Vec<String> = v
        .iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path))
        .collect();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(SchemaError::Violations(errs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_testsupport::errors::assert_cause_is_source;

    #[test]
    fn schema_errors_keep_their_cause_as_source_only() {
        let parse = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let invalid = jsonschema::validator_for(&serde_json::json!({"type": 5})).unwrap_err();
        let cases = [
            (parse.to_string(), SchemaError::Parse(parse)),
            (invalid.to_string(), SchemaError::Invalid(Box::new(invalid))),
        ];
        for (cause, e) in &cases {
            assert_cause_is_source(e, Some(cause));
        }
    }

    #[test]
    fn violations_name_their_json_pointer() {
        let e = validate(&serde_json::json!({"schema_version": "x"})).unwrap_err();
        let SchemaError::Violations(v) = &e else {
            panic!("{e:?}");
        };
        assert!(!v.is_empty());
        assert!(e.to_string().contains("/schema_version: "), "{e}");
    }
}
