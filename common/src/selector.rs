//! Label selector matching (`matchLabels` and `matchExpressions` with In, NotIn, Exists,
//! DoesNotExist), as the apiserver evaluates a ring's `namespaceSelector`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::Error;

/// Whether `labels` satisfy `selector`. An empty selector matches everything. Unknown
/// operators are an error naming the operator.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> Result<bool, Error> {
    if let Some(required) = &selector.match_labels
        && required.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return Ok(false);
    }
    for expr in selector.match_expressions.iter().flatten() {
        let value = labels.get(&expr.key);
        let values = expr.values.as_deref().unwrap_or_default();
        let ok = match expr.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(Error::InvalidRing(format!(
                    "spec.namespaceSelector has unknown operator {other:?} (use In, NotIn, Exists or DoesNotExist)"
                )));
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    fn expr(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: operator.into(),
                values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).into()).collect()),
            }]),
        }
    }

    #[test]
    fn selectors_match_like_the_apiserver() {
        let team_a = labels(&[("team", "a"), ("env", "prod")]);
        let none = labels(&[]);
        let table = [
            (LabelSelector::default(), &team_a, true),
            (LabelSelector::default(), &none, true),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("team", "a")])),
                    match_expressions: None,
                },
                &team_a,
                true,
            ),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("team", "b")])),
                    match_expressions: None,
                },
                &team_a,
                false,
            ),
            (expr("team", "In", &["a", "b"]), &team_a, true),
            (expr("team", "In", &["b"]), &team_a, false),
            (expr("team", "In", &["a"]), &none, false),
            (expr("team", "NotIn", &["b"]), &team_a, true),
            (expr("team", "NotIn", &["a"]), &team_a, false),
            (expr("team", "NotIn", &["a"]), &none, true),
            (expr("env", "Exists", &[]), &team_a, true),
            (expr("env", "Exists", &[]), &none, false),
            (expr("env", "DoesNotExist", &[]), &team_a, false),
            (expr("env", "DoesNotExist", &[]), &none, true),
        ];
        for (i, (selector, labels, want)) in table.into_iter().enumerate() {
            assert_eq!(matches(&selector, labels).expect("valid"), want, "row {i}");
        }
    }

    #[test]
    fn an_unknown_operator_is_an_error() {
        let err = matches(&expr("a", "Gt", &["1"]), &labels(&[])).expect_err("unknown");
        assert!(err.to_string().contains("\"Gt\""), "{err}");
    }
}
