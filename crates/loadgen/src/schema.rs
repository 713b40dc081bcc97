//! The JSON Schema of the result document (`schema.json` beside this crate, embedded), and validation
//! against it: the CLI checks every document before writing it, so a schema drift is caught at once.

/// The schema text.
pub(crate) const SCHEMA: &str = include_str!("../schema.json");

/// Validate a document; the error lists every violation with its JSON pointer.
pub fn validate(doc: &serde_json::Value) -> Result<(), String> {
    let schema: serde_json::Value =
        serde_json::from_str(SCHEMA).map_err(|e| format!("schema does not parse: {e}"))?;
    let v = jsonschema::validator_for(&schema).map_err(|e| format!("schema invalid: {e}"))?;
    let errs: Vec<String> = v
        .iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path))
        .collect();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}
