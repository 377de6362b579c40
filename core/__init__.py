"""The ground floor: value types and rules that every stage shares and that import no stage."""
