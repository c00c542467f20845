package smsstub

import (
	"encoding/json"
	"io"
	"net/http"
)

// maxFaultsBytes bounds a POST /admin/faults body; a Faults object is tiny.
const maxFaultsBytes = 16 << 10

func (s *Server) handleDeliveries(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, mustJSON(s.Deliveries()))
}

func (s *Server) handleTaken(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, mustJSON(s.Taken()))
}

func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, mustJSON(s.Stats()))
}

func (s *Server) handleReset(w http.ResponseWriter, _ *http.Request) {
	s.Reset()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, mustJSON(s.Faults()))
}

// handleSetFaults replaces the faults with the posted object and answers
// the faults now in force, so the caller sees the defaults that applied.
func (s *Server) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxFaultsBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, http.StatusBadRequest, "could not read request body: "+err.Error())
		return
	}
	var f Faults
	if err := json.Unmarshal(raw, &f); err != nil {
		writeError(w, http.StatusBadRequest, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.SetFaults(f); err != nil {
		writeError(w, http.StatusBadRequest, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, mustJSON(s.Faults()))
}
